r"""Checkers for the book's exercises, one module per chapter on one shared core.

A checker runs a learner's function on a handful of cases and compares the result with
the package's reference::

    >>> from companion import checks
    >>> checks.check_softmax(my_softmax)
    ✓ check_softmax: all 3 cases pass

* a pass prints that one line and returns a true ``CheckResult`` (equal to
  ``True``; Jupyter shows no ``Out:`` under it, so a solution cell can end with the
  call);
* a stub (``raise NotImplementedError``, or ``pass``) prints ``check_softmax: not
  attempted yet ...`` and returns a false one, so Run All goes on;
* :class:`CheckError`: a case failed. In Jupyter it shows as two lines, no traceback:
  what differs, in words, then the property, the input, expected and got. Outside
  IPython it is an ordinary exception whose message says *which property* failed, *on
  what input*, what was expected and what came (with enough digits to differ, and the
  relative error), and names the known mistake the answer matches::

    CheckError: check_softmax: 'normalizes along dim, not another axis' failed on
    x=(3, 4) float32, dim=0
      expected: [...]
      got:      [...]
      This is the known mistake "softmax over the wrong axis": ...

The learner's function is called with **positional** arguments in the order the exercise
states, on copies of the inputs; its answer may be a tensor, a NumPy array, a nested
list or (where a number is asked) a Python number.

====================  =====================  ======================================
module                chapter                checkers
====================  =====================  ======================================
``environment``       0 Setting up           :func:`check_softmax`
``positional``        1 Sinusoidal encoding  :func:`check_sinusoidal_encoding`, ...
``rope``              2 RoPE                 :func:`check_apply_rope`, ...
``extension``         3 Context extension    :func:`check_alibi_slopes`, ...
``relative``          4 Position family      :func:`check_t5_bucket`, ...
``attention``         5 Attention            :func:`check_attention`, ...
``norm``              6 Normalization        :func:`check_layer_norm`, ...
``model``             7 A tiny Transformer   :func:`check_lag_targets`, ...
``decoder``           8 Real models          :func:`check_kv_cache_bytes`, ...
``modern``            9 Modern decoders      :func:`check_receptive_field`, ...
``mla``               9 Modern decoders      :func:`check_mla_cache_bytes`, ...
``attention_2026``    10 Attention 2025-26   :func:`check_sink_softmax`, ...
``linear_attention``  11 Linear attention    :func:`check_delta_rule_step`, ...
``performance``       Appendix: performance  :func:`check_ulp32`, ...
====================  =====================  ======================================

Writing a checker for a new chapter (say ``decoder.py`` for chapter 8):

1. Create ``companion/checks/decoder.py``; import the chapter's module at the top
   (``from companion import decoder``) and the core
   (``from companion.checks._core import Case, Mistake, checker``).
2. Write the checker as a generator decorated with ``checker``. Its positional
   parameters are the learner's functions (validated as callables); for each case, build
   small seeded inputs in the order the exercise states, the reference answer, and the
   outputs of the known wrong variants, and ``yield Case(prop, inputs, expected,
   mistakes)``::

       @checker
       def check_kv_cache(step: Callable[..., Tensor]) -> Iterator[Case]:
           '''Check ``step(query, cache)`` ... Named mistakes: "cache not appended".'''
           for length in (1, 5):
               inputs = {"query": ..., "cache": ...}
               yield Case("attends to every cached key", inputs, reference,
                          [Mistake("cache not appended", "append the new key ...",
                          wrong)])

   Tolerances, an exact dtype (``check_dtype``), an integer dtype (``integer``), a tuple
   answer (``parts=("y", "cache")``, mistakes with ``None`` for the parts they leave
   right) and a mistake recognized by the size of its error (``Mistake(..., atol=...)``)
   are options of ``Case`` and ``Mistake``.
3. Add the module's checkers to the imports and ``__all__`` below, and test them in
   ``tests/checks/test_checks_decoder.py`` both ways: correct answers written in several
   styles pass, and each named mistake is named.
"""

from companion.checks._core import Case as Case  # the core, for checker authors
from companion.checks._core import CheckError
from companion.checks._core import Mistake as Mistake
from companion.checks._core import checker as checker
from companion.checks._core import describe_inputs as describe_inputs
from companion.checks._core import expect_close as expect_close
from companion.checks.attention import (
    check_attention,
    check_causal_mask,
    check_masked_attention,
    check_split_heads,
    check_tiled_attention,
)
from companion.checks.attention_2026 import (
    check_chunked_mask,
    check_nope_layers,
    check_proportional_pairs,
    check_sink_gradient,
    check_sink_softmax,
)
from companion.checks.decoder import (
    check_cached_attention,
    check_kv_cache_bytes,
    check_repeat_kv,
)
from companion.checks.environment import check_softmax
from companion.checks.extension import (
    check_alibi_slopes,
    check_llama3_frequencies,
    check_ntk_aware_base,
    check_yarn_ramp,
)
from companion.checks.linear_attention import (
    check_chunked_delta_rule,
    check_delta_rule_step,
    check_hybrid_cache_bytes,
    check_qwen3_next_gates,
)
from companion.checks.mla import (
    check_absorbed_scores,
    check_mla_cache_bytes,
)
from companion.checks.model import (
    check_absolute_targets,
    check_lag_targets,
    check_masked_accuracy,
)
from companion.checks.modern import (
    check_padding_position_ids,
    check_receptive_field,
    check_sink_cache_keep,
    check_stablelm_port,
)
from companion.checks.norm import (
    check_batch_norm,
    check_layer_norm,
    check_residual_blocks,
    check_rms_norm,
    check_variance,
)
from companion.checks.performance import (
    check_roofline_time,
    check_tiled_attention_intensity,
    check_ulp32,
)
from companion.checks.positional import (
    check_dot_product_curve,
    check_normalized_positions,
    check_shift_matrix,
    check_shift_recurrence,
    check_sinusoidal_encoding,
    check_wavelengths,
)
from companion.checks.relative import (
    check_decay_sum,
    check_p_rope_frequencies,
    check_shaw_relative_index,
    check_t5_bucket,
)
from companion.checks.rope import (
    check_apply_rope,
    check_rope_attention,
    check_rope_cos_sin,
    check_rope_frequencies,
    check_rope_weight_permutation,
)

__all__ = [
    "CheckError",
    "check_absolute_targets",
    "check_absorbed_scores",
    "check_alibi_slopes",
    "check_apply_rope",
    "check_attention",
    "check_batch_norm",
    "check_cached_attention",
    "check_causal_mask",
    "check_chunked_delta_rule",
    "check_chunked_mask",
    "check_decay_sum",
    "check_delta_rule_step",
    "check_dot_product_curve",
    "check_hybrid_cache_bytes",
    "check_kv_cache_bytes",
    "check_lag_targets",
    "check_layer_norm",
    "check_llama3_frequencies",
    "check_masked_accuracy",
    "check_masked_attention",
    "check_mla_cache_bytes",
    "check_nope_layers",
    "check_normalized_positions",
    "check_ntk_aware_base",
    "check_p_rope_frequencies",
    "check_padding_position_ids",
    "check_proportional_pairs",
    "check_qwen3_next_gates",
    "check_receptive_field",
    "check_repeat_kv",
    "check_residual_blocks",
    "check_rms_norm",
    "check_roofline_time",
    "check_rope_attention",
    "check_rope_cos_sin",
    "check_rope_frequencies",
    "check_rope_weight_permutation",
    "check_shaw_relative_index",
    "check_shift_matrix",
    "check_shift_recurrence",
    "check_sink_cache_keep",
    "check_sink_gradient",
    "check_sink_softmax",
    "check_sinusoidal_encoding",
    "check_softmax",
    "check_split_heads",
    "check_stablelm_port",
    "check_t5_bucket",
    "check_tiled_attention",
    "check_tiled_attention_intensity",
    "check_ulp32",
    "check_variance",
    "check_wavelengths",
    "check_yarn_ramp",
]
