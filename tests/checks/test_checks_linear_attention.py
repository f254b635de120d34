"""Chapter 11's checkers (one step of the gated delta rule, its chunked form,
Qwen3-Next's gates, the bytes of its cache): correct answers in several styles pass
(loops, NumPy, lists, float32; the papers' (Dv, D) state transposed back), each named
mistake is named; a stub is "not attempted yet"."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from companion import linear_attention as la
from companion import qwen3_next
from companion.checks import CheckError
from companion.checks import linear_attention as checks


def _stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize(
    "check",
    [
        checks.check_delta_rule_step,
        checks.check_chunked_delta_rule,
        checks.check_qwen3_next_gates,
        checks.check_hybrid_cache_bytes,
    ],
    ids=lambda c: c.__name__,
)
def test_a_stub_is_not_attempted(check, capsys) -> None:
    result = check(_stub)
    assert not result
    assert "not attempted yet" in capsys.readouterr().out


# ---- check_delta_rule_step -----------------------------------------------------------


def step_torch(state, q, k, v, g, beta):
    m = math.exp(g) * state
    m = m + torch.outer(k, beta * (v - m.T @ k))
    return m.T @ q, m


def step_papers(state, q, k, v, g, beta):
    """The papers' S = M^T (Dv, D): S alpha (I - beta k k^T) + beta v k^T, in NumPy."""
    s, q, k, v = (np.asarray(x, dtype=np.float32) for x in (state.T, q, k, v))
    s = s @ (math.exp(g) * (np.eye(len(k)) - beta * np.outer(k, k))) + beta * np.outer(
        v, k
    )
    return (s @ q).tolist(), s.T


def step_companion(state, q, k, v, g, beta):
    out, m = la.gated_delta_rule(
        q[None, None, None], k[None, None, None], v[None, None, None],
        torch.tensor([[[g]]], dtype=q.dtype), torch.tensor([[[beta]]], dtype=q.dtype),
        mode="recurrent", initial_state=state[None, None],
    )  # fmt: skip
    return out[0, 0, 0], m[0, 0]


@pytest.mark.parametrize(
    "answer",
    [step_torch, step_papers, step_companion],
    ids=["torch", "papers", "companion"],
)
def test_delta_rule_step_accepts(answer) -> None:
    assert checks.check_delta_rule_step(answer)


def test_delta_rule_step_names(named) -> None:
    def plain(state, q, k, v, g, beta):
        m = math.exp(g) * state + beta * torch.outer(k, v)
        return m.T @ q, m

    def undecayed(state, q, k, v, g, beta):
        m = math.exp(g) * state + torch.outer(k, beta * (v - state.T @ k))
        return m.T @ q, m

    def after(state, q, k, v, g, beta):
        m = math.exp(g) * (state + torch.outer(k, beta * (v - state.T @ k)))
        return m.T @ q, m

    def old(state, q, k, v, g, beta):
        return state.T @ q, step_torch(state, q, k, v, g, beta)[1]

    def before_write(state, q, k, v, g, beta):
        return (math.exp(g) * state).T @ q, step_torch(state, q, k, v, g, beta)[1]

    def g_as_decay(state, q, k, v, g, beta):
        m = g * state
        m = m + torch.outer(k, beta * (v - m.T @ k))
        return m.T @ q, m

    named(lambda: checks.check_delta_rule_step(plain), "linear-attention write")
    named(
        lambda: checks.check_delta_rule_step(undecayed),
        "correction from the undecayed state",
    )
    named(lambda: checks.check_delta_rule_step(after), "decay after the write")
    named(lambda: checks.check_delta_rule_step(old), "output read from the old state")
    named(
        lambda: checks.check_delta_rule_step(before_write),
        "output read before the write",
    )
    named(lambda: checks.check_delta_rule_step(g_as_decay), "g used as the decay")


def test_delta_rule_step_wants_a_pair() -> None:
    with pytest.raises(CheckError, match="Return a pair"):
        checks.check_delta_rule_step(lambda *a: step_torch(*a)[1])


# ---- check_chunked_delta_rule --------------------------------------------------------


def chunked_loop(q, k, v, g, beta, chunk_size):
    """Any chunking of the recurrence is right: the loop itself, chunk by chunk."""
    m, out = torch.zeros(q.shape[1], v.shape[1], dtype=q.dtype), []
    for s in range(0, q.shape[0], chunk_size):
        for t in range(s, min(s + chunk_size, q.shape[0])):
            o, m = step_torch(m, q[t], k[t], v[t], float(g[t]), float(beta[t]))
            out.append(o)
    return torch.stack(out)


def chunked_wy(q, k, v, g, beta, chunk_size, *, diagonal=False, read_entry=True):
    """The chapter's chunked form, written out in float32 (padding the last chunk);
    ``diagonal`` and ``read_entry`` make two of the named mistakes."""
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    length, c = q.shape[0], chunk_size
    m, outs = torch.zeros(q.shape[1], v.shape[1]), []
    for s in range(0, length, c):
        qc, kc, vc, gc, bc = (x[s : s + c] for x in (q, k, v, g, beta))
        big_g = gc.cumsum(0)
        gam = (big_g[:, None] - big_g[None, :]).tril().exp().tril()
        a = (bc[:, None] * (kc @ kc.T) * gam).tril(0 if diagonal else -1)
        eye = torch.eye(len(qc))
        w = torch.linalg.solve_triangular(eye + a, bc[:, None] * vc, upper=False)
        y = torch.linalg.solve_triangular(
            eye + a, (bc * big_g.exp())[:, None] * kc, upper=False
        )
        u = w - y @ m
        entry = big_g.exp()[:, None] * (qc @ m) if read_entry else 0
        outs.append(entry + ((qc @ kc.T) * gam) @ u)
        m = big_g[-1].exp() * m + (kc * (big_g[-1] - big_g).exp()[:, None]).T @ u
    return torch.cat(outs).numpy()


@pytest.mark.parametrize(
    "answer", [chunked_loop, chunked_wy], ids=["loop", "wy-float32"]
)
def test_chunked_delta_rule_accepts(answer) -> None:
    assert checks.check_chunked_delta_rule(answer)


def test_chunked_delta_rule_names(named) -> None:
    def reset(q, k, v, g, beta, chunk_size):
        return torch.cat([
            torch.as_tensor(chunked_loop(*(x[s : s + chunk_size] for x in (q, k, v, g, beta)), chunk_size))
            for s in range(0, q.shape[0], chunk_size)
        ])  # fmt: skip

    named(
        lambda: checks.check_chunked_delta_rule(reset),
        "state not carried across chunks",
    )
    named(
        lambda: checks.check_chunked_delta_rule(
            lambda q, k, v, g, beta, c: chunked_loop(q, k, v, 0 * g, beta, c)
        ),
        "decay left out",
    )
    named(
        lambda: checks.check_chunked_delta_rule(
            lambda *a: chunked_wy(*a, read_entry=False)
        ),
        "entry state not read",
    )
    named(
        lambda: checks.check_chunked_delta_rule(
            lambda *a: chunked_wy(*a, diagonal=True)
        ),
        "A with its diagonal",
    )

    def plain(q, k, v, g, beta, chunk_size):
        m, out = torch.zeros(q.shape[1], v.shape[1], dtype=q.dtype), []
        for t in range(q.shape[0]):
            m = g[t].exp() * m + beta[t] * torch.outer(k[t], v[t])
            out.append(m.T @ q[t])
        return torch.stack(out)

    named(lambda: checks.check_chunked_delta_rule(plain), "linear-attention write")


# ---- check_qwen3_next_gates ----------------------------------------------------------


def gates_torch(a, b, a_log, dt_bias):
    return -a_log.exp() * F.softplus(a + dt_bias), b.sigmoid()


def gates_numpy(a, b, a_log, dt_bias):
    a, b, a_log, dt_bias = (np.asarray(x) for x in (a, b, a_log, dt_bias))
    return -np.exp(a_log) * np.log1p(np.exp(a + dt_bias)), 1 / (1 + np.exp(-b))


@pytest.mark.parametrize("answer", [gates_torch, gates_numpy], ids=["torch", "numpy"])
def test_qwen3_next_gates_accepts(answer) -> None:
    assert checks.check_qwen3_next_gates(answer)


def test_qwen3_next_gates_names(named) -> None:
    cases = {
        "decay instead of its log": lambda a, b, al, dt: (gates_torch(a, b, al, dt)[0].exp(), b.sigmoid()),
        "g with the wrong sign": lambda a, b, al, dt: (al.exp() * F.softplus(a + dt), b.sigmoid()),
        "A_log used without exp": lambda a, b, al, dt: (-al * F.softplus(a + dt), b.sigmoid()),
        "dt_bias left out": lambda a, b, al, dt: (-al.exp() * F.softplus(a), b.sigmoid()),
        "softplus left out": lambda a, b, al, dt: (-al.exp() * (a + dt), b.sigmoid()),
        "beta not squashed": lambda a, b, al, dt: (gates_torch(a, b, al, dt)[0], b),
    }  # fmt: skip
    for name, answer in cases.items():
        named(lambda answer=answer: checks.check_qwen3_next_gates(answer), name)


# ---- check_hybrid_cache_bytes --------------------------------------------------------


def cache_python(n_lin, n_full, hk, hv, dk, dv, kernel, hkv, d, tokens):
    state = n_lin * ((kernel - 1) * (2 * hk * dk + hv * dv) * 2 + hv * dk * dv * 4)
    return state + tokens * n_full * 2 * hkv * d * 2


def cache_companion(n_lin, n_full, hk, hv, dk, dv, kernel, hkv, d, tokens):
    spec = type("Config", (), {})()
    spec.layer_types = ["linear_attention"] * n_lin + ["full_attention"] * n_full
    for name, value in zip(
        ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
         "linear_value_head_dim", "linear_conv_kernel_dim", "num_key_value_heads",
         "head_dim"), (hk, hv, dk, dv, kernel, hkv, d), strict=True,
    ):  # fmt: skip
        setattr(spec, name, value)
    got = qwen3_next.state_cache_bytes(spec)
    return torch.tensor(float(got.state_per_sequence + tokens * got.kv_per_token))


@pytest.mark.parametrize(
    "answer", [cache_python, cache_companion], ids=["python", "companion"]
)
def test_hybrid_cache_bytes_accepts(answer) -> None:
    assert checks.check_hybrid_cache_bytes(answer)


def test_hybrid_cache_bytes_names(named) -> None:
    def variant(
        *,
        state=4,
        grow=False,
        every=False,
        factor=2,
        conv=True,
        extra=0,
        key_heads=False,
    ):
        def answer(n_lin, n_full, hk, hv, dk, dv, kernel, hkv, d, tokens):
            c = (
                n_lin * (kernel - 1 + extra) * (2 * hk * dk + hv * dv) * 2
                if conv
                else 0
            )
            s = c + n_lin * (hk if key_heads else hv) * dk * dv * state
            layers = n_lin + n_full if every else n_full
            kv = layers * factor * hkv * d * 2
            return tokens * (s + kv) if grow else s + tokens * kv

        return answer

    named(
        lambda: checks.check_hybrid_cache_bytes(variant(grow=True)),
        "state grows with the tokens",
    )
    named(
        lambda: checks.check_hybrid_cache_bytes(variant(state=2)), "state in bfloat16"
    )
    named(
        lambda: checks.check_hybrid_cache_bytes(variant(every=True)),
        "every layer caches keys and values",
    )
    named(
        lambda: checks.check_hybrid_cache_bytes(variant(key_heads=True)),
        "state per key head",  # not "state in bfloat16", which halves it too at H_v = 2 H_k
    )
    named(lambda: checks.check_hybrid_cache_bytes(variant(factor=1)), "keys only")
    named(
        lambda: checks.check_hybrid_cache_bytes(variant(conv=False)),
        "convolution state left out",
    )
    named(
        lambda: checks.check_hybrid_cache_bytes(variant(extra=1)),
        "K convolution columns",
    )
