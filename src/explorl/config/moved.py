"""Keys of earlier versions of the config and what replaced them: refused with the new form in a user's YAML and on
the command line (`explorl.config.building.from_dict`), translated in a run directory's recorded config.yaml
(`explorl.config.recorded`). This module imports nothing of explorl.
"""

from __future__ import annotations

from typing import Any

# Keys of earlier versions, where each method's options were flat fields of the core sections: refused with the
# new key (`explorl.config.building.from_dict`).
MOVED_KEYS: dict[str, str] = {
    **{f"algo.erpo_{f}": f"algo.erpo.{f}" for f in ("beta_progress", "gamma", "eta", "num_buckets", "sigma_target")},
    "algo.cw_bandwidth": "algo.cw.bandwidth",
    **{f"algo.ppl_{f}": f"algo.ppl.{f}" for f in ("alpha", "iqr_filter", "clamp")},
    **{f"algo.position_{f}": f"algo.position.{f}" for f in ("gamma", "m", "d", "n", "start", "steps", "cap_frac")},
    **{f"algo.entropy_adv_{f}": f"algo.entropy_adv.{f}" for f in ("alpha", "kappa")},
    "algo.passk_k": "algo.passk.k",
    **{f"algo.clip_cov_{f}": f"algo.clip_cov.{f}" for f in ("ratio", "lb", "ub")},
    "algo.kl_cov_k_percent": "algo.kl_cov.k_percent", "algo.kl_cov_coef": "algo.kl_cov.coef",
    "algo.forking_top_frac": "algo.forking.top_frac", "algo.dual_clip_c": "algo.ppo.dual_clip_c",
    "sampling.e3_anneal": "sampling.e3.anneal", "sampling.e3_eta": "sampling.e3.eta",
    "sampling.e3_anneal_frac": "sampling.e3.anneal_frac", "sampling.tau_floor": "sampling.e3.tau_floor",
    "sampling.tau_ceil": "sampling.e3.tau_ceil",
    **{f"sampling.ead_{f}": f"sampling.ead.{f}" for f in ("tau_max", "tau_min", "d0", "alpha", "d_max", "c", "scale")},
    **{f"sampling.adaptive_{f}": f"sampling.adaptive.{f}" for f in ("base", "gamma", "target")},
    **{f"budget.{f}": f"budget.e3.{f}" for f in ("g_min_limit", "g_max_limit", "g_step", "curriculum", "g_min_start",
                                                 "g_max_start")},
    "budget.dapo_max_rounds": "budget.dapo.max_rounds",
    "algo.tis_cap": "algo.tis.cap", "algo.tis_level": "algo.tis.level",
    "algo.overlong_buffer": "algo.dapo_overlong.buffer", "algo.overlong_penalty": "algo.dapo_overlong.penalty",
}

# Switches of earlier versions that became the selection of a registry entry (issue 40: EAD's truncated importance
# sampling and DAPO's overlong shaping): each old value -> the setting that replaces it, refused with it by
# `explorl.config.building.from_dict`. The entry's options then live under its name (`MOVED_KEYS`).
MOVED_SWITCHES: dict[str, dict[Any, str]] = {
    "algo.tis": {True: "algo.importance_weights=tis", False: "algo.importance_weights=none"},
    "algo.overlong": {"penalty": "algo.reward_shapers=[dapo_overlong]",
                      "mask": "algo.reward_shapers=[dapo_overlong_filter]", "none": "algo.reward_shapers=[]"},
}
