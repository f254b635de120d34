"""Benchmark: one greedy decoding step with and without the KV cache, as the sequence
grows.

A Llama-shaped model with random weights (Hugging Face ``LlamaForCausalLM`` built from a
small config, no download) is copied with :func:`companion.decoder.from_hf`. For each
context length ``S`` two cases are timed side by side in one run
(``harness.time_cases``),
on the same tokens:

- ``with cache``: ``model.decode(next_token, past)``, one query at position ``S``
  against the ``S`` cached keys and values of every layer (what
  :func:`companion.decoder.generate` does for each new token);
- ``without cache``: ``model(ids)`` on all ``S + 1`` tokens, the last row of logits kept
  (what decoding without a cache recomputes for every new token).

Both give the same next-token logits (the largest difference is printed). The ratio
``without / with`` is the speed-up the cache buys at that length; the ratio of the
no-cache time at the largest and smallest length shows how recomputation grows with
``S``.

Run from the repository root (``make bench`` does)::

    .venv/bin/python benchmarks/bench_decoder.py [--device cuda] [--lengths 64 256 1024]

Writes benchmarks/results/decoder.md and decoder.json.
"""

from __future__ import annotations

import torch
from harness import Report, parser, start, time_cases

from companion.decoder import from_hf

CONFIG = (
    dict(  # a small Llama: 4 layers, width 256, 8 query heads sharing 2 key/value heads
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    device = start(args)
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    model = from_hf(hf).to(device)
    del hf
    report = Report(
        "decoder",
        f"Greedy decoding step with and without the KV cache, float32 on {device}",
        device,
        {"model": CONFIG, "batch": args.batch, "rounds": args.rounds},
        args=args,
    )
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for length in args.lengths:
            ids = torch.randint(
                3, CONFIG["vocab_size"], (args.batch, length + 1), generator=gen
            )
            ids = ids.to(device)
            _, past = model.decode(ids[:, :length])  # the S cached tokens
            nxt = ids[:, length:]  # (B, 1): the token at position S

            def cached(nxt=nxt, past=past):
                return model.decode(nxt, past)[0]

            def full(ids=ids):
                return model(ids)[:, -1:]

            error = (cached() - full()).abs().max().item()
            medians = time_cases({"with cache": cached, "without cache": full}, args)
            rows.append(
                {
                    "length": length,
                    "with_ms": medians["with cache"] * 1e3,
                    "without_ms": medians["without cache"] * 1e3,
                    "speedup": medians["without cache"] / medians["with cache"],
                    "max_diff": error,
                }
            )
    report.table(
        "Time per generated token at context length S (median of interleaved rounds)",
        {
            "length": ("S (cached tokens)", "d"),
            "with_ms": ("with cache (ms)", ".3f"),
            "without_ms": ("without cache (ms)", ".3f"),
            "speedup": ("without / with", ".1f"),
            "max_diff": ("max |logit diff|", ".1e"),
        },
        rows,
    )
    first, last = rows[0], rows[-1]
    report.note(
        f"From S = {first['length']} to S = {last['length']} "
        f"({last['length'] / first['length']:.0f}x longer) the step without cache "
        "takes "
        f"{last['without_ms'] / first['without_ms']:.1f}x as long, the cached step "
        f"{last['with_ms'] / first['with_ms']:.1f}x as long."
    )
    report.goal(
        "the cached step is faster than recomputation at every length, same logits",
        all(r["speedup"] > 1 and r["max_diff"] < 1e-4 for r in rows),
        ", ".join(f"{r['speedup']:.1f}x at S={r['length']}" for r in rows),
    )
    report.finish(args.out_dir)


if __name__ == "__main__":
    main()
