from tests.support.cli import assert_one_line_error
from tests.support.cli import run_cli_isolated as run_cli


def test_plan_prints_weights_cache_and_verdict(tmp_path, tiny_model_dir):
    proc = run_cli(
        ["plan", "--model", str(tiny_model_dir), "--budget-gb", "1", "--max-context", "2048"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "weights" in out and "KV cache" in out and "(q8, 2048 tokens)" in out
    assert "fits" in out


def test_plan_q4_cache_is_smaller_than_fp16(tmp_path, smol_dir):
    def cache_line(mode: str) -> str:
        proc = run_cli(
            ["plan", "--model", str(smol_dir), "--cache-mode", mode, "--max-context", "8192"], tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        return next(line for line in proc.stdout.splitlines() if line.startswith("KV cache"))

    fp16, q4 = cache_line("fp16"), cache_line("q4")
    assert float(fp16.split()[2]) > 3 * float(q4.split()[2])


def test_plan_rejects_non_positive_budget(tmp_path, tiny_model_dir):
    proc = run_cli(["plan", "--model", str(tiny_model_dir), "--budget-gb", "0"], tmp_path)
    assert_one_line_error(proc, "--budget-gb")
