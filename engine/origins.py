"""Which characters of a reply came from accepted drafts: text runs per origin, split from Chunks.

Draft highlighting (F6) needs text per origin (accepted from the draft vs the target's own token). A verification
round's chunk is shaped `accepted drafts..., one target token`, so `split_chunk_by_origin` decodes just the
trailing target-own tokens with the backend's tokenizer and splits the chunk text there; where that does not
line up (a multi-byte character cut across tokens, an unusual shape) it falls back to a proportional split by
token count. The session keeps a reply's runs with the stored reply (`encode_runs`), so a reply reopened from
the history is coloured as it was when it streamed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.events import Chunk

# (text, from_draft)
OriginRun = tuple[str, bool]


def split_chunk_by_origin(chunk: Chunk, decode: Callable[[list[int]], str] | None = None) -> list[OriginRun]:
    origins = chunk.origins
    if not chunk.text:
        return []
    if not origins or all(origins) or not any(origins):
        return [(chunk.text, bool(origins) and origins[0])]
    runs: list[tuple[bool, list[int]]] = []
    for index, origin in enumerate(origins):
        if runs and runs[-1][0] == origin:
            runs[-1][1].append(index)
        else:
            runs.append((origin, [index]))
    # The usual shape: one run of accepted drafts, then the target's own token(s).
    if len(runs) == 2 and decode is not None and len(chunk.token_ids) == len(origins):
        tail_ids = [chunk.token_ids[i] for i in runs[1][1]]
        try:
            tail = decode(tail_ids)
        except Exception:  # noqa: BLE001 - a decode hiccup only costs precision of the colouring
            tail = ""
        if tail and chunk.text.endswith(tail) and len(tail) < len(chunk.text):
            cut = len(chunk.text) - len(tail)
            return [(chunk.text[:cut], runs[0][0]), (chunk.text[cut:], runs[1][0])]
    # Fallback: split the text in proportion to token counts.
    out: list[OriginRun] = []
    total = len(origins)
    consumed = 0
    position = 0
    for origin, indices in runs:
        consumed += len(indices)
        end = round(len(chunk.text) * consumed / total)
        if end > position:
            out.append((chunk.text[position:end], origin))
        position = end
    return out


def merge_runs(runs: list[OriginRun], new: Sequence[OriginRun]) -> None:
    """Append `new` to `runs`, joining neighbours of the same origin so the list stays short."""
    for text, origin in new:
        if not text:
            continue
        if runs and runs[-1][1] == origin:
            runs[-1] = (runs[-1][0] + text, origin)
        else:
            runs.append((text, origin))


def encode_runs(runs: Sequence[OriginRun]) -> list[int]:
    """Runs as alternating lengths, the first the target's own (0 when the reply starts with a draft)."""
    lengths: list[int] = []
    drafted = True  # so a first run of the target's own text opens a new length
    for text, origin in runs:
        if not text:
            continue
        if origin == drafted and lengths:
            lengths[-1] += len(text)
            continue
        if not lengths and origin:
            lengths.append(0)
        lengths.append(len(text))
        drafted = origin
    return lengths


def decode_runs(text: str, lengths: Sequence[int] | None) -> list[OriginRun] | None:
    """`encode_runs` back into runs of `text`; None when the lengths do not add up to it (not this text's)."""
    if not lengths or sum(lengths) != len(text) or any(not isinstance(n, int) or n < 0 for n in lengths):
        return None
    runs: list[OriginRun] = []
    position = 0
    for index, length in enumerate(lengths):
        if length:
            runs.append((text[position : position + length], index % 2 == 1))
        position += length
    return runs
