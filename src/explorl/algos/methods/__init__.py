"""explorl's built-in methods, one file each, written as a user's plugin is (docs/add-a-method.md): a header naming
the paper and the equations, the options dataclass, its check, the maths, the registration with its `cites=`.

Estimators: `grpo` (`grpo`, `dr_grpo`), `erpo`, `passk`, `rloo`, `reinforce_pp` (`reinforce_plus_plus`,
`reinforce_plus_plus_baseline`), `opo`, `gpg`, `gdpo`, `grpo_passk` (verl's pass@k), `optimal_token_baseline`
(pi_old's forward fills its `sum_pi_squared`), `nsr` (`psr`, `nsr`, `w_reinforce`), `qae`, `rl_zvp`,
`maxrl`. Shapers: `cw` (`cw`, `cw_group`, `cw_balanced`), `ppl`, `position`, `entropy_adv`. Policy losses: `ppo`,
`clip_cov`, `kl_cov`, `luspo`, `vespo` (TRL's), `simko` (explorl's loop only: it reads the forward's top-K log-probs).
Token filters: `forking` (`none`, `forking`). Reward shapers: `dapo_overlong` (`dapo_overlong`, `dapo_overlong_filter`:
DAPO's overlong shaping).
Importance weights: `tis` (`none`, `tis`: EAD's truncated importance sampling), `rollout_correction` (`rollout_is`,
and the shaper `off_policy_mask`); reward shaper `rollout_rejection` (`rollout_rs`); policy loss `bypass`
(`bypass_mode`, verl's bypass mode). The pieces they share are
`explorl.algos.core` and `explorl.algos.aggregation`; `explorl methods` lists every entry with its paper and the
`file:line` of its code. Importing this package registers them all, each module of it found by name, so a new built-in
method is one new file (`explorl.algos` imports this package; the registry itself imports no method).
"""

from __future__ import annotations

import importlib
import pkgutil

# every module of this package, in name order: a new method is one new file here and nothing else
MODULES = tuple(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
for _name in MODULES:
    importlib.import_module(f"{__name__}.{_name}")
