"""Origin runs carry the source of each accepted draft (F6 colours history drafts apart), stored and read back."""

from __future__ import annotations

from engine.events import Chunk
from engine.origins import decode_runs, encode_runs, merge_runs, split_chunk_by_origin


def chunk(text, ids, origins, drafter=None):
    return Chunk(text, tuple(ids), len(ids), sum(origins), tuple(origins), t=0.0, drafter=drafter)


def test_a_chunks_accepted_drafts_are_marked_with_its_drafter():
    pieces = {1: " the", 2: " cat", 3: " sat"}
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    c = chunk(" the cat sat", [1, 2, 3], [True, True, False], drafter="history")
    assert split_chunk_by_origin(c, decode) == [(" the cat", "history"), (" sat", False)]
    # A backend that does not say who drafted: True, as before.
    c = chunk(" the cat sat", [1, 2, 3], [True, True, False])
    assert split_chunk_by_origin(c, decode) == [(" the cat", True), (" sat", False)]


def test_runs_of_each_source_survive_the_store_and_old_rows_read_as_before():
    runs: list = []
    merge_runs(runs, [("Hi ", False), ("there ", "history"), ("you", "ngram"), ("!", False), ("ok", True)])
    encoded = encode_runs(runs)
    assert encoded == [3, [6, "history"], 0, [3, "ngram"], 1, 2]
    text = "".join(t for t, _ in runs)
    assert decode_runs(text, encoded) == runs
    # A reply that starts with a history draft.
    assert encode_runs([("abc", "history"), ("d", False)]) == [0, [3, "history"], 1]
    assert decode_runs("abcd", [0, [3, "history"], 1]) == [("abc", "history"), ("d", False)]
    # Rows stored before sources were kept: plain lengths, every draft True.
    assert decode_runs("abcdef", [2, 3, 1]) == [("ab", False), ("cde", True), ("f", False)]
    # Lengths that are not this text's, or garbage, read as no colouring.
    assert decode_runs("abc", [1, [5, "history"]]) is None
    assert decode_runs("abc", [1, ["x", "history"]]) is None
