"""The run's page (explore.html) from explore.py's content: one self-contained file, no network, font or
server (docs/explore.md). The activations travel as int8 (each unit scaled by its largest |value|: finer
than any colour step), base64, at most MAX_UNITS per layer, those the rankings name first. The page's
state is in its URL's hash, so a link opens it in a given view (`#mode=stateless&minus=stateful`).
"""

import base64
import html
import json
from pathlib import Path

import torch

TEMPLATE = Path(__file__).with_name("explore_page.html")  # the page's HTML, style and script
MAX_UNITS = 512  # per layer: a Leviathan layer (1,024 units) would double the page for units no ranking names


def encode_layers(activations: torch.Tensor, sizes: list[int], rankings: dict) -> list[dict]:
    """Per layer: its size, stored units (all up to MAX_UNITS, else those the rankings name first, sorted),
    each one's scale and the int8 activations (row-major, base64)."""
    layers, offset = [], 0
    for layer, size in enumerate(sizes):
        units = list(range(size))
        if size > MAX_UNITS:  # those the rankings name, then the others, each in order (a stable sort)
            named = {unit for rows in rankings.values() for lay, unit, *_ in rows if lay == layer}
            units = sorted(sorted(units, key=lambda u: u not in named)[:MAX_UNITS])
        block = activations[:, offset + torch.tensor(units)]
        scale = block.abs().max(0).values.clamp(min=1e-8)
        q = (block / scale * 127).round().clamp(-127, 127).to(torch.int8)
        layers.append({"size": size, "units": units, "scale": [round(float(s), 5) for s in scale],
                       "data": base64.b64encode(q.contiguous().numpy().tobytes()).decode()})
        offset += size
    return layers


def render_page(data: dict) -> str:
    data = dict(data)
    activations = data.pop("activations", None)
    data["units"] = encode_layers(activations, data["layers"], data["rankings"]) if activations is not None else []
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(f"{data['title']['model']}: explore")
    return TEMPLATE.read_text(encoding="utf-8").replace("__TITLE__", title).replace("__DATA__", payload)
