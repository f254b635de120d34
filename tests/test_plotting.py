"""Tests of the shared plot helpers in companion.plotting (each chapter tests its own)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from companion import plotting


def test_to_numpy_copies_tensors_and_arrays_as_float64() -> None:
    t = torch.arange(3, dtype=torch.bfloat16, requires_grad=False)
    a = plotting.to_numpy(t)
    assert a.dtype == np.float64 and a.tolist() == [0.0, 1.0, 2.0]
    src = np.ones(2, dtype=np.float32)
    out = plotting.to_numpy(src)
    out[0] = 5
    assert src[0] == 1, "to_numpy must copy"


def test_heatmap_draws_the_matrix_and_labels_without_touching_rcparams() -> None:
    before = dict(matplotlib.rcParams)
    fig, ax = plt.subplots()
    m = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    out = plotting.heatmap(ax, m, title="t", xlabel="x", ylabel="y", xticklabels=["a", "b"])
    assert out is ax
    image = ax.get_images()[0]
    np.testing.assert_array_equal(image.get_array(), m.numpy())
    assert image.get_clim() == (-2.0, 2.0), "symmetric colour scale centred on zero"
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("t", "x", "y")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    assert dict(matplotlib.rcParams) == before
    plt.close(fig)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("not axes", torch.zeros(2, 2)), TypeError, r"ax must be a matplotlib Axes, got str"),
        ((None, torch.zeros(2, 2)), TypeError, r"ax must be a matplotlib Axes, got NoneType"),
    ],
)
def test_heatmap_validates_ax(args: tuple, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        plotting.heatmap(*args)


def test_heatmap_rejects_non_2d() -> None:
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match=r"matrix must be 2-D, got shape \(3,\)"):
        plotting.heatmap(ax, torch.zeros(3))
    plt.close(fig)


def test_to_numpy_rejects_lists() -> None:
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor or numpy.ndarray, got list"):
        plotting.to_numpy([1, 2])  # type: ignore[arg-type]
