"""Benchmark: the Triton kernels of companion.kernels against their floors and SDPA (GPU).

Run from the repository root (``make bench`` runs it; tests never do)::

    .venv/bin/python benchmarks/bench_kernels.py --device cuda

On a CUDA device, side by side in one run (``harness.time_cases``):

- **RoPE** at (1, 32, 4096, 128), float32 and bfloat16: ``kernels.rope`` (half layout) on q and
  k against ``q.clone(), k.clone()`` (the floor of any out-of-place rotation: one read, one
  write) and the eager and fused ``apply_rope``. Goal: the Triton kernel within 1.15x of the
  clone.
- **FlashAttention forward** at L = 4096 and 16384, D = 128, bfloat16, B = 1, H = 16, causal
  and not: ``kernels.flash_attention`` against ``F.scaled_dot_product_attention`` restricted
  to its flash backend. Throughput is 4 B H L S D flops (half of that when causal) per second.
  Goal: at least 0.7x SDPA's throughput. Peak memory above the inputs at both lengths: it must
  grow as O(L) (the output and the log-sum-exp), not O(L^2).
- **FlashAttention forward + backward**, same shapes: one call and ``out.backward(dO)``
  (the FlashAttention-2 backward kernels) against the same with SDPA's flash backend. Goal: at
  least 0.5x SDPA's throughput (the ratio of the two times for the same result).

Before any timing, on every device, the kernels' values and gradients are checked against
SDPA at a small size (on a CPU through Triton's interpreter): a wrong kernel stops the script.

On a CPU the kernels run only through Triton's interpreter, a correctness tool that executes
each program in NumPy; timing it says nothing about the kernels, so on a CPU the script runs
that check, times nothing and records that every GPU goal was not measured: no figure is
written for a GPU that did not run. Without Triton installed it says so and writes the same
"not measured" record.

Writes ``benchmarks/results/kernels.md`` and ``kernels.json``. To keep a GPU run as the record
the appendix shows, copy ``kernels.json`` to ``benchmarks/recorded/kernels-cuda.json``.

The CUDA branch of this script has not run yet: no GPU has been available to the project's
sessions, so every goal above is unmeasured (``benchmarks/recorded/README.md`` lists what is
not yet measured).
"""

from __future__ import annotations

import datetime

import torch
import torch.nn.functional as F
from harness import Report, parser, peak_memory, ratios, start, time_cases

from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

ROPE_SHAPE = (1, 32, 4096, 128)  # (B, H, L, D)
FLASH_LENGTHS = (4096, 16384)
FLASH_HEADS, FLASH_DIM = 16, 128


def rope_cases(q, k, cos, sin) -> dict:
    """The same rotation of q and k by each implementation, and the copy floor."""
    from companion import kernels

    return {
        "clone floor": lambda: (q.clone(), k.clone()),
        "Triton kernels.rope": lambda: (
            kernels.rope(q, cos, sin),
            kernels.rope(k, cos, sin),
        ),
        "apply_rope eager": lambda: (apply_rope(q, cos, sin), apply_rope(k, cos, sin)),
        "apply_rope fused": lambda: (
            apply_rope(q, cos, sin, fused=True),
            apply_rope(k, cos, sin, fused=True),
        ),
    }


def bench_rope(report: Report, device: torch.device, args) -> None:
    from companion import kernels

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        q, k = (
            torch.randn(ROPE_SHAPE, generator=gen).to(device, dtype) for _ in range(2)
        )
        cos, sin = rope_cos_sin(
            torch.arange(ROPE_SHAPE[2]), rope_frequencies(ROPE_SHAPE[3]), device=device
        )
        cases = rope_cases(q, k, cos, sin)
        torch.testing.assert_close(kernels.rope(q, cos, sin), apply_rope(q, cos, sin))
        medians = time_cases(cases, args)
        to_clone = ratios(medians, "clone floor")
        for name, t in medians.items():
            rows.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "case": name,
                    "us": t * 1e6,
                    "clone": to_clone[name],
                }
            )
        ratio = to_clone["Triton kernels.rope"]
        report.goal(
            f"Triton RoPE <= 1.15x x.clone() at {ROPE_SHAPE}, {dtype}",
            ratio <= 1.15,
            f"{ratio:.2f}x",
        )
    report.table(
        f"RoPE on q and k, {ROPE_SHAPE}",
        {
            "dtype": ("dtype", ""),
            "case": ("implementation", ""),
            "us": ("median µs", ".1f"),
            "clone": ("/ clone", ".2f"),
        },
        rows,
    )


def check_values(report: Report, device: torch.device) -> None:
    """Forward and gradients of both kernels against the torch references, small sizes
    (seconds through the interpreter): a wrong kernel is never timed."""
    from companion import kernels

    gen = torch.Generator().manual_seed(1)
    # a transposed query (the layout a model makes), L != S, float32
    q = torch.randn(1, 48, 2, 64, generator=gen).transpose(1, 2).to(device)
    k, v = (torch.randn(1, 2, 80, 64, generator=gen).to(device) for _ in "kv")
    errors = {}
    for causal in (False, True):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out, _ = kernels.flash_attention(*inputs, is_causal=causal, block_m=16)
        d_out = torch.randn(out.shape, generator=gen).to(device)
        got = [out, *torch.autograd.grad(out, inputs, d_out)]
        ref_in = [t.detach().double().requires_grad_() for t in inputs]
        ref = F.scaled_dot_product_attention(*ref_in, is_causal=causal)
        want = [ref, *torch.autograd.grad(ref, ref_in, d_out.double())]
        for name, g, w in zip(("out", "dQ", "dK", "dV"), got, want, strict=True):
            err = (g.double() - w).abs().max().item()
            errors[name] = max(errors.get(name, 0.0), err)
            if not err < 1e-4:  # fails on NaN too
                raise SystemExit(
                    f"kernels.flash_attention {name} is wrong: error {err}"
                )
    cos, sin = rope_cos_sin(torch.arange(48), rope_frequencies(64), device=device)
    x = q.detach().clone().requires_grad_()
    got = kernels.rope(x, cos, sin)
    want = apply_rope(x, cos, sin)
    (g_got,) = torch.autograd.grad(got, x, torch.ones_like(got))
    (g_want,) = torch.autograd.grad(want, x, torch.ones_like(want))
    errors["rope"] = (got - want).abs().max().item()
    errors["rope dx"] = (g_got - g_want).abs().max().item()
    if not max(errors["rope"], errors["rope dx"]) < 1e-5 or any(
        e != e for e in errors.values()
    ):
        raise SystemExit(f"kernels.rope is wrong: errors {errors}")
    report.note(
        "Values checked before timing (float32, transposed query, L=48, S=80, D=64, "
        "causal and not; largest |error| against float64 SDPA and its autograd, and "
        "against apply_rope): "
        + ", ".join(f"{name} {err:.1e}" for name, err in errors.items())
    )


def bench_flash(report: Report, device: torch.device, args) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from companion import kernels

    rows, peaks = [], {}
    for length in FLASH_LENGTHS:
        for causal in (False, True):
            gen = torch.Generator().manual_seed(0)
            shape = (1, FLASH_HEADS, length, FLASH_DIM)
            q, k, v = (
                torch.randn(shape, generator=gen).to(device, torch.bfloat16)
                for _ in "qkv"
            )

            def sdpa(q=q, k=k, v=v, causal=causal):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def triton(q=q, k=k, v=v, causal=causal):
                return kernels.flash_attention(q, k, v, is_causal=causal)

            torch.testing.assert_close(triton()[0], sdpa(), atol=2e-2, rtol=0)
            medians = time_cases(
                {"SDPA flash": sdpa, "Triton flash_attention": triton}, args
            )
            flops = (
                4 * FLASH_HEADS * length * length * FLASH_DIM * (0.5 if causal else 1.0)
            )
            rel = medians["SDPA flash"] / medians["Triton flash_attention"]
            for name, t in medians.items():
                rows.append(
                    {
                        "L": length,
                        "causal": causal,
                        "case": name,
                        "ms": t * 1e3,
                        "tflops": flops / t / 1e12,
                    }
                )
            report.goal(
                f"Triton FlashAttention forward >= 0.7x SDPA flash throughput, L={length}, "
                f"D={FLASH_DIM}, bf16, causal={causal}",
                rel >= 0.7,
                f"{rel:.2f}x",
            )
            if not causal:
                peaks[length] = peak_memory(triton, device)
            # forward + backward: one call and out.backward(dO) each
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            d_out = torch.randn(shape, generator=gen).to(device, torch.bfloat16)

            def sdpa_fb(causal=causal, qg=qg, kg=kg, vg=vg, d_out=d_out):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                out.backward(d_out)

            def triton_fb(causal=causal, qg=qg, kg=kg, vg=vg, d_out=d_out):
                out, _ = kernels.flash_attention(qg, kg, vg, is_causal=causal)
                out.backward(d_out)

            medians_fb = time_cases(
                {"SDPA flash fwd+bwd": sdpa_fb, "Triton fwd+bwd": triton_fb}, args
            )
            rel_fb = medians_fb["SDPA flash fwd+bwd"] / medians_fb["Triton fwd+bwd"]
            for name, t in medians_fb.items():
                rows.append(
                    {
                        "L": length,
                        "causal": causal,
                        "case": name,
                        "ms": t * 1e3,
                        "tflops": 3.5 * flops / t / 1e12,  # backward: 2.5x the forward
                    }
                )
            report.goal(
                f"Triton FlashAttention forward+backward >= 0.5x SDPA flash throughput, "
                f"L={length}, D={FLASH_DIM}, bf16, causal={causal}",
                rel_fb >= 0.5,
                f"{rel_fb:.2f}x",
            )
    report.table(
        f"FlashAttention forward, and forward + backward (TFLOP/s counts the backward "
        f"as 2.5x the forward), B=1, H={FLASH_HEADS}, D={FLASH_DIM}, bfloat16",
        {
            "L": ("L", "d"),
            "causal": ("causal", ""),
            "case": ("implementation", ""),
            "ms": ("median ms", ".2f"),
            "tflops": ("TFLOP/s", ".1f"),
        },
        rows,
    )
    small, large = FLASH_LENGTHS
    growth = peaks[large] / peaks[small]
    report.note(
        f"Peak memory above the inputs: {peaks[small] / 2**20:.1f} MiB at L={small}, "
        f"{peaks[large] / 2**20:.1f} MiB at L={large}: x{growth:.2f} for x{large // small} "
        "in L (O(L^2) would be x16)"
    )
    report.goal(
        "Triton FlashAttention peak memory O(L)",
        growth <= 1.25 * (large / small),
        f"x{growth:.2f} for x{large // small} in L",
    )


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    device = start(args)
    report = Report(
        "kernels",
        "Triton kernels: RoPE and FlashAttention, forward and backward",
        device,
        {
            "rope shape": ROPE_SHAPE,
            "flash lengths": FLASH_LENGTHS,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        },
        args,
    )
    try:
        from companion import kernels
    except ImportError as err:
        kernels = None
        report.note(f"Not measured: Triton is not usable here ({err}).")
    if kernels is not None and (device.type == "cpu") == kernels.interpreted():
        check_values(report, device)
    elif kernels is not None:
        report.note(
            "Values not checked: the kernels run on "
            f"{'the CPU (interpreter)' if kernels.interpreted() else 'CUDA'} here, "
            f"not on {device}."
        )
    if kernels is not None and device.type == "cuda":
        bench_rope(report, device, args)
        bench_flash(report, device, args)
    else:
        report.note(
            "Not measured: the kernels' goals are GPU goals (RoPE within 1.15x of "
            "x.clone(), FlashAttention forward >= 0.7x and forward+backward >= 0.5x SDPA's "
            "throughput, peak memory O(L)). Without a CUDA device the kernels run only "
            "through Triton's interpreter, a correctness tool, so nothing is timed and no "
            "GPU figure is written. Run with --device cuda on a GPU."
        )
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
