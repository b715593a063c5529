"""Which characters of a reply came from accepted drafts: text runs per origin, split from Chunks.

Draft highlighting (F6) needs text per origin (accepted from the draft vs the target's own token). A verification
round's chunk is shaped `accepted drafts..., one target token`, so `split_chunk_by_origin` decodes just the
trailing target-own tokens with the backend's tokenizer and splits the chunk text there; where that does not
line up (a multi-byte character cut across tokens, an unusual shape) it falls back to a proportional split by
token count. The session keeps a reply's runs with the stored reply (`encode_runs`), so a reply reopened from
the history is coloured as it was when it streamed.

A run's origin is False (the target's own text), or the source of the accepted draft it came from: the round's
drafter (`Chunk.drafter`: "ngram", "history", "model", "mtp"), or True where the backend does not say who drafted.
Both are truthy, so "came from a draft" reads the same either way; F6 colours history drafts apart by the name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.events import Chunk

# False: the target's own; True: an accepted draft, its source not said; a drafter's name: an accepted draft of it.
Origin = bool | str
# (text, origin)
OriginRun = tuple[str, Origin]


def draft_origin(chunk: Chunk) -> Origin:
    """What a chunk's accepted drafts are marked with: its drafter's name, or True where the backend does not say."""
    return chunk.drafter or True


def split_chunk_by_origin(chunk: Chunk, decode: Callable[[list[int]], str] | None = None) -> list[OriginRun]:
    """The chunk's text as runs by origin (see the module doc): its accepted drafts marked with their source."""
    drafted = draft_origin(chunk)
    return [(text, drafted if origin else False) for text, origin in _split(chunk, decode)]


def _split(chunk: Chunk, decode: Callable[[list[int]], str] | None) -> list[tuple[str, bool]]:
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
    out: list[tuple[str, bool]] = []
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


def encode_runs(runs: Sequence[OriginRun]) -> list[int | list]:
    """Runs as alternating lengths, the first the target's own (0 when the reply starts with a draft). A draft run
    whose source is known is `[length, source]` (a plain length: the source was not said); two draft runs of
    different sources in a row have a 0 of the target's own between them."""
    lengths: list[int | list] = []
    drafted: Origin = True  # so a first run of the target's own text opens a new length
    for text, origin in runs:
        if not text:
            continue
        if lengths and origin == drafted:
            last = lengths[-1]
            if isinstance(last, list):
                last[0] += len(text)
            else:
                lengths[-1] = last + len(text)
            continue
        if origin and (not lengths or drafted):
            lengths.append(
                0
            )  # the target's own between: none (the reply starts with a draft, or a new source)
        lengths.append([len(text), origin] if isinstance(origin, str) else len(text))
        drafted = origin
    return lengths


def decode_runs(text: str, lengths: Sequence[int | list] | None) -> list[OriginRun] | None:
    """`encode_runs` back into runs of `text`; None when the lengths do not add up to it (not this text's)."""
    if not lengths:
        return None
    parsed: list[tuple[int, Origin]] = []
    for index, entry in enumerate(lengths):
        drafted = index % 2 == 1
        if isinstance(entry, list) and drafted and len(entry) == 2 and isinstance(entry[1], str):
            length, origin = entry[0], entry[1] or True
        else:
            length, origin = entry, drafted
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            return None
        parsed.append((length, origin))
    if sum(length for length, _ in parsed) != len(text):
        return None
    runs: list[OriginRun] = []
    position = 0
    for length, origin in parsed:
        if length:
            runs.append((text[position : position + length], origin))
        position += length
    return runs
