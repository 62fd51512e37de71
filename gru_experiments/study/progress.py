"""Progress bars for the end-of-run evaluation: one per inference mode or context-curve point, as
training shows one per epoch (tqdm, as Lightning's own bar). Off with trainer.enable_progress_bar=false.

    progress = Progress(enabled=True)
    with progress.phase("stateful", total=forward_tokens) as tick:
        ...; tick(tokens_just_run)
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


def _ignore(_: int) -> None:
    pass


class Progress:
    """Bars in forward tokens (the tokens run through the model), so every bar fills at the rate
    the model runs."""

    def __init__(self, enabled: bool = True, prefix: str = "evaluation"):
        self.enabled, self.prefix = enabled, prefix

    @contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if not self.enabled:
            yield _ignore
            return
        from tqdm.auto import tqdm

        with tqdm(total=int(total), desc=f"{self.prefix}: {name}", unit="tok", unit_scale=True, leave=True,
                  dynamic_ncols=True, file=sys.stderr, mininterval=1.0) as bar:
            yield bar.update
            bar.n = bar.total  # a sampled pass may run a few tokens fewer than planned; close shows it full


NO_PROGRESS = Progress(enabled=False)
