"""The render-cards pipeline of the design notes as one workload function.

Each card is rendered on the ``renderer`` endpoint (a completion), then embedded on the
``embed`` helper endpoint, which the start phase starts on the job's GPUs beside the
renderer and the clear phase stops after execute (the seed's ``clear_embeddings``). The
job returns one summary per card. Run it::

    makespan gpu-worker --fleet examples/render-pipeline.toml --host host-a \\
        --workloads makespan.examples.render_cards
    python -c "import makespan; print(makespan.connect().submit('render_cards', 20).result())"
"""

from __future__ import annotations

from typing import Any

import makespan

MAX_CARDS = 10_000  # a count above this is refused (every title and summary is held in memory)


@makespan.workload(endpoint="renderer", helpers=("embed",), name="render_cards", retries=1, expected_s=300)
def render_cards(ctx: makespan.WorkloadContext, cards: int | list[str] = 20) -> dict[str, Any]:
    """Render and embed ``cards`` (a count, or the card titles); returns their summaries.

    The renderer is called through ``ctx.requests`` under its concurrency cap; with an
    ``embed`` server among ``ctx.endpoint_urls`` each rendered card is embedded there
    (a simulated ``embed`` endpoint has no server: the summary says so)."""
    if isinstance(cards, bool) or not (isinstance(cards, int) and 0 <= cards <= MAX_CARDS
                                       or isinstance(cards, list) and all(isinstance(c, str) for c in cards)):
        # checked before any request: a string would be rendered character by character
        raise TypeError(f"cards: a count (0 to {MAX_CARDS}) or a list of titles, got {cards!r:.80}")
    titles = [f"card {i}" for i in range(cards)] if isinstance(cards, int) else list(cards)
    rendered = ctx.requests([f"render {title}" for title in titles], max_tokens=64)
    ctx.progress(len(titles), 2 * len(titles), "rendered")
    embed_note = ""
    if "embed" in ctx.endpoint_urls:
        vectors = ctx.requests(rendered, route="/v1/embeddings", endpoint="embed")
    else:
        vectors = [None] * len(titles)
        embed_note = "not embedded: the embed endpoint on these GPUs has no server (a simulated endpoint)"
    ctx.progress(2 * len(titles), 2 * len(titles), "embedded" if not embed_note else "rendered; not embedded")
    summaries = [{"title": title, "text": (text or "")[:80], "embedding_dims": len(vec) if vec else 0}
                 for title, text, vec in zip(titles, rendered, vectors)]
    out = {"cards": summaries, "rendered": len(summaries), "embedded": sum(1 for v in vectors if v),
           "gpus": ctx.gpus, "attempt": ctx.attempt}
    if embed_note:
        out["embed_note"] = embed_note
    return out
