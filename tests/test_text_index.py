"""The index of study/text_index.py: the vectorised word rule is the one word rule at every position, and the
vocabulary read in pieces is the whole text's."""

from __future__ import annotations


def test_the_vectorised_word_rule_is_the_one_word_rule_at_every_position():
    from gru_experiments.study.text_index import is_word_char, word_char_mask

    text = "'O'er the hill, 'tis John’s\n'a' d’ É日本 x'y'' ’z’\n'"
    assert word_char_mask(text).tolist() == [is_word_char(text, i) for i in range(len(text))]
    assert word_char_mask("").tolist() == []


def test_the_vocabulary_read_in_pieces_is_the_whole_texts():
    from gru_experiments.study.text_index import vocabulary, words

    text = "O'er the hill\n'tis John’s\nhill-top, THE end" * 3
    whole = frozenset(words(text))
    assert all(vocabulary([text[i:i + n] for i in range(0, len(text), n)]) == whole for n in (1, 3, 7, 1000))
