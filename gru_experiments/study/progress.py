"""Progress bars for the evaluation, one per pass (tqdm, as Lightning's own bar); off with
trainer.enable_progress_bar=false. `with progress.phase(name, total) as tick: ...; tick(tokens_run)`.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


class Progress:
    """Bars in forward tokens, so that every bar fills at the rate the model runs."""

    def __init__(self, enabled: bool = True, prefix: str = "evaluation"):
        self.enabled, self.prefix = enabled, prefix

    @contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        if not self.enabled:
            yield lambda _: None
            return
        from tqdm.auto import tqdm

        with tqdm(total=int(total), desc=f"{self.prefix}: {name}", unit="tok", unit_scale=True, leave=True,
                  dynamic_ncols=True, file=sys.stderr, mininterval=1.0) as bar:
            yield bar.update
            bar.n = bar.total  # a sampled pass may run a few tokens fewer than planned; close shows it full


NO_PROGRESS = Progress(enabled=False)
