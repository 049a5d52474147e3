"""explorl's built-in methods, one file each, written as a user's plugin is (docs/add-a-method.md): a header naming
the paper and the equations, the options dataclass, its check, the maths, the registration with its `cites=`.

Estimators: `grpo` (`grpo`, `dr_grpo`), `erpo`, `passk`. Shapers: `cw` (`cw`, `cw_group`, `cw_balanced`), `ppl`,
`position`, `entropy_adv`. Policy losses: `ppo`, `clip_cov`, `kl_cov`. Token filters: `forking` (`none`,
`forking`). Reward shapers: `dapo_overlong` (`dapo_overlong`, `dapo_overlong_filter`: DAPO's overlong shaping).
Importance weights: `tis` (`none`, `tis`: EAD's truncated importance sampling). The pieces they share are
`explorl.algos.core` and `explorl.algos.aggregation`; `explorl methods` lists every entry with its paper and the
`file:line` of its code. Importing this package registers them all (`explorl.algos` imports it; the registry itself
imports no method).
"""

from __future__ import annotations

from explorl.algos.methods import grpo, erpo, passk  # noqa: F401  (estimators)
from explorl.algos.methods import cw, ppl, position, entropy_adv  # noqa: F401  (shapers)
from explorl.algos.methods import ppo, clip_cov, kl_cov  # noqa: F401  (policy losses)
from explorl.algos.methods import forking  # noqa: F401  (token filters)
from explorl.algos.methods import dapo_overlong  # noqa: F401  (reward shapers)
from explorl.algos.methods import tis  # noqa: F401  (importance weights)
