"""benchmarks/induction_curves.py's measures on hand-built attention patterns."""

import io

import numpy as np
import pytest

from benchmarks import induction_curves


def _pattern(length: int, key_of) -> np.ndarray:
    """[batch 1, q, k]: each query q attends wholly to key_of(q) (BOS, then two copies)."""
    width = 1 + 2 * length
    out = np.zeros((1, width, width))
    for q in range(width):
        out[0, q, key_of(q)] = 1.0
    return out


def test_attention_mass_of_a_perfect_induction_head():
    length = 8
    mass = induction_curves.attention_mass(
        _pattern(length, lambda q: q - length + 1 if q > length else 0), length)
    assert mass["target"] == 1.0 and mass["argmax_is_target"] == 1.0
    assert mass["target-1"] == mass["target+1"] == mass["bos"] == mass["self"] == 0.0
    assert abs(mass["rest_of_first_copy"]) < 1e-9 and mass["repeat_so_far"] == 0.0


def test_attention_mass_of_a_previous_token_head():
    length = 8
    mass = induction_curves.attention_mass(_pattern(length, lambda q: max(q - 1, 0)), length)
    assert mass["all_q:prev"] == 1.0 and mass["query-1"] == 1.0
    assert mass["target"] == 0.0 and mass["all_q:self"] == 0.0


def test_tee_keeps_the_logged_losses():
    out = io.StringIO()
    tee = induction_curves._Tee(out)
    tee.write("step     50/8000 | loss 2.6399 (min 2.6399) | 1 seeds | 2.2 steps/s\n")
    tee.write("step    100/8000 | loss 2.4353 (min 2.4353) | 1 seeds\n")
    assert tee.losses == {50: 2.6399, 100: 2.4353}
    assert out.getvalue().count("\n") == 2


def test_a_curve_file_of_other_columns_is_refused_before_any_work(tmp_path):
    path = tmp_path / "curve.csv"
    induction_curves.check_curve_file(str(path))  # none yet: fine
    path.write_text(",".join(induction_curves.COLUMNS) + "\n500,1.0\n")
    induction_curves.check_curve_file(str(path))
    path.write_text("step,loss,prev_token,score\n500,1.0,0.2,0.01\n")
    with pytest.raises(SystemExit, match="other columns"):
        induction_curves.check_curve_file(str(path))
