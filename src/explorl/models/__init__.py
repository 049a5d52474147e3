"""Loading policies and references; the character-level tokenizer and tiny Qwen2 model of the embedded default.

Any Hugging Face causal LM directory loads through `load_policy` (`AutoModelForCausalLM`, `AutoTokenizer`), and
so does a LoRA adapter directory (`adapter_config.json`, as `final/` of a LoRA run): its base model is read from
`base_model_name_or_path` and the adapter is merged into it with peft. A run's outputs (`RUN`, `RUN/final`,
`RUN/checkpoints/step_N`) load through `find_run_output` and `load_run_output`, and `load_model_under_test` gives
what `explorl eval` evaluates (a run's output or a model directory). What a whole run reads before its first step is
checked above the models, in `explorl.train.preflight`.
With LoRA the reference policy is the same module with its adapters disabled (`reference_logprobs` handles
both cases), so a reference never costs a second copy of the weights.

The modules, each re-exported here:

- `devices`: `model.device` and `model.dtype` resolved (`resolve_device` is looked up there at call time, so
  replacing `explorl.models.devices.resolve_device` reaches every load);
- `embedded`: the shipped models: their directories, the character tokenizer, the tiny Qwen2 architecture;
- `paths`: what `model.path` names (`embedded`, a model directory, a LoRA adapter and its base);
- `fingerprint`: the hash of a model's weights recorded with every run and evaluation;
- `loading`: a model and its tokenizer, a policy for training, the reference policy;
- `run_outputs`: a run's `final/` and checkpoints as models, and the model under test of `explorl eval`.

A name re-exported here is a copy of the binding: to replace a function for a test, replace it in the module that
calls it (e.g. `explorl.models.run_outputs.load_policy` for `load_run_output`).
"""

from __future__ import annotations

from explorl.models.devices import DeviceError, resolve_device, resolve_dtype
from explorl.models.embedded import (CHAR_ALPHABET, CHAR_SPECIALS, EMBEDDED_PACKAGE_DIR, EMBEDDED_TESTBED_DIR,
                                     TinyQwen2Sizes, build_char_tokenizer, embedded_dir, tiny_qwen2)
from explorl.models.fingerprint import WEIGHT_SUFFIXES, check_fingerprint, weights_fingerprint
from explorl.models.loading import (GENERIC_TOKENIZER_CLASSES, check_lora_targets, count_parameters, is_peft,
                                    load_causal_lm, load_policy, load_tokenizer, make_reference, reference_mode)
from explorl.models.paths import ADAPTER_CONFIG, adapter_base, is_adapter_dir, resolve_model_path
from explorl.models.run_outputs import (RunOutput, find_run_output, load_model_under_test, load_run_output,
                                        load_trainable)

__all__ = [
    "ADAPTER_CONFIG", "CHAR_ALPHABET", "CHAR_SPECIALS", "DeviceError", "EMBEDDED_PACKAGE_DIR", "EMBEDDED_TESTBED_DIR",
    "GENERIC_TOKENIZER_CLASSES", "RunOutput", "TinyQwen2Sizes", "WEIGHT_SUFFIXES", "adapter_base",
    "build_char_tokenizer", "check_fingerprint", "check_lora_targets", "count_parameters", "embedded_dir",
    "find_run_output", "is_adapter_dir", "is_peft", "load_causal_lm", "load_model_under_test", "load_policy",
    "load_run_output", "load_tokenizer", "load_trainable", "make_reference", "reference_mode", "resolve_device",
    "resolve_dtype", "resolve_model_path", "tiny_qwen2", "weights_fingerprint",
]
