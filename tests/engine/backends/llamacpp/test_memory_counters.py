"""What dropping drafts cost on a recurrent model, in the one line the task bench prints."""

from engine.backends.llamacpp.memory import MemoryCounters


def test_the_line_says_each_cost_per_event() -> None:
    counters = MemoryCounters(
        rollbacks=63,
        checkpoints=4,
        checkpoint_s=0.02,
        checkpoint_bytes=20_200_000,
        restores=2,
        restore_s=0.01,
        replayed=10,
        replay_s=0.05,
    )
    assert counters.describe() == (
        "63 rollbacks; 4 checkpoints (20.2 MB, 5.00 ms each); 2 restores (5.00 ms each); 10 tokens replayed "
        "(5.00 ms a token); 0 re-prefilled"
    )
    assert "checkpoints (0.0 MB, -)" in MemoryCounters().describe()


def test_clear_counts_from_zero_in_the_same_object() -> None:
    counters = MemoryCounters(rollbacks=3, checkpoints=2, checkpoint_s=0.5, replayed=7, reprefilled=24)
    held = counters  # the memory keeps this object: clearing must not replace it
    counters.clear()
    assert held is counters and counters == MemoryCounters()
