"""Numbers the relative-position chapter (issue 27) can state, asserted here.

T5's buckets at its defaults (32 buckets, max_distance 128): the encoder's 16 buckets of
one direction start at distances 0-7 (exact), then 8, 12, 16, 23, 32, 46, 64, 91, and
every distance from 91 on shares the last; the decoder's 32 past buckets are exact to 15,
then logarithmic from 16 to 113. Phi-3-mini-128k's LongRoPE attention factor,
sqrt(1 + ln 32 / ln 4096) = 1.1902. Men et al.'s lower bound of the base at D = 128 and
L = 1024 is 4.29e3 (the paper's table: 4.3e3), and the admissible bases above it are
not an interval. The oracles are Hugging Face's T5 code, the formula, and a brute-force
check of B(m) >= 0 for every m.
"""

from __future__ import annotations

import math

import pytest
import torch

from companion.relative import (
    longrope_attention_factor,
    rope_base_lower_bound,
    rope_decay_sum,
    t5_relative_position_bucket,
)

transformers = pytest.importorskip("transformers")
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402


def _first_distance_per_bucket(bidirectional: bool, buckets: int) -> list[int]:
    distance = torch.arange(0, 400)
    bucket = t5_relative_position_bucket(-distance, bidirectional=bidirectional)
    theirs = T5Attention._relative_position_bucket(
        -distance, bidirectional=bidirectional
    )
    assert torch.equal(bucket, theirs)
    return [int(distance[bucket == k][0]) for k in range(buckets)]


def test_t5_encoder_bucket_edges() -> None:
    edges = _first_distance_per_bucket(True, 16)
    assert edges == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91]
    # a key in the future: the same edges, 16 buckets up
    future = t5_relative_position_bucket(torch.tensor([1, 8, 91, 10**6]))
    assert future.tolist() == [17, 24, 31, 31]


def test_t5_decoder_bucket_edges() -> None:
    edges = _first_distance_per_bucket(False, 32)
    assert edges[:17] == list(range(17))
    assert edges[16:] == [
        16,
        19,
        21,
        24,
        27,
        31,
        35,
        40,
        46,
        52,
        59,
        67,
        77,
        87,
        99,
        113,
    ]
    # every future key shares bucket 0 with the query itself
    assert t5_relative_position_bucket(
        torch.tensor([0, 1, 500]), bidirectional=False
    ).tolist() == [0, 0, 0]


def test_phi3_longrope_attention_factor() -> None:
    factor = longrope_attention_factor(131072 / 4096, 4096)
    assert factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert round(factor, 4) == 1.1902


def test_base_bound_at_1024_matches_the_paper() -> None:
    bound = rope_base_lower_bound(1024, 128)
    assert round(bound, -1) == 4290.0
    assert abs(bound / 4.3e3 - 1) < 0.01  # Men et al., Table: 4.3e3 for 1k
    m = torch.arange(1025)
    assert float(rope_decay_sum(m, 128, base=bound).min()) >= 0
    assert float(rope_decay_sum(m, 128, base=4200.0).min()) < 0
    assert float(rope_decay_sum(m, 128, base=5000.0).min()) < 0  # the gap above it
