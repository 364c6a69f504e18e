"""examples/train_recall.py trains: a 2-layer model on associative recall, kernels in the interpreter.

~60 s on one CPU core. The bar is not only "the loss went down" (predicting that answers are value
tokens gets the loss from ln(12) to ln(6)) but the loss of the last steps under ln(6), the best a
model can do without reading the pairs back from its state.
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
    assert last < 0.75 * first, (first, last)
    assert last < math.log(cfg.values), (first, last, losses[-10:])
