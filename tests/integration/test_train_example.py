"""examples/train_recall.py trains: a 2-layer model on associative recall, kernels in the interpreter.

~60 s on one CPU core. The loss must fall clearly: by a quarter, and to well under chance (ln 12).
Reading the pairs back from the state (loss under ln 6, the best guess among the values without
context) takes this size ~50-60 steps, too close to the CI budget to assert; the example prints the
recall accuracy, and the GPU size learns it.
"""

import importlib.util
import math
import sys

from tests.support import REPO_ROOT


def test_training_example_learns_recall():
    spec = importlib.util.spec_from_file_location("train_recall", REPO_ROOT / "examples" / "train_recall.py")
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses look their module up there
    spec.loader.exec_module(example)
    cfg = example.Config(steps=50, log_every=0)
    losses = example.train(cfg)
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert all(math.isfinite(x) for x in losses)
    assert first > math.log(cfg.keys + cfg.values) - 0.3, losses[:5]  # it started near chance
    assert last < 0.8 * first, (first, last, losses[-10:])
    assert last < math.log(cfg.keys + cfg.values) - 0.4, (first, last, losses[-10:])
