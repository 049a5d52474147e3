"""The papers explorl implements, by the short name that code, configs and docs/methods.md cite them by.

A registry entry names what it implements with `cites=(Cite("ERPO", "eq. 7, eq. 8", doc="3"), ...)`
(`explorl.algos.registry.Cite`); `explorl methods` prints the entries with these papers. The five papers the
project is built on are E3, ERPO, CW-GRPO, EAD and STILL; their authors, titles and arXiv ids are as each paper's
own text gives them (`arxiv` is None where the text gives no id of its own). The baselines are named by author and
title as docs/methods.md §1 and §5 cite them (no arXiv id is recorded for them). `OWN` ("explorl") is the paper
value of explorl's own additions, which are in no paper; they cite the section of docs/methods.md that defines
them.

This module imports nothing of explorl: the registry and every method module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """A paper explorl implements a method of."""

    authors: str
    """The authors as the paper's own text (the five) or docs/methods.md (the baselines) gives them."""
    title: str
    """The title, as the same source gives it."""
    arxiv: str | None
    """The arXiv id the paper's own text gives, or None where it gives none (or, for a baseline, is not recorded)."""
    doc_sections: tuple[str, ...]
    """The sections of docs/methods.md that document the paper (`"2"` = `## 2.`, `"5a"` = `### 5a.`)."""


OWN = "explorl"
"""The paper value of a method that is explorl's own (in no paper); it cites the docs/methods.md section that
defines it."""

PAPERS: dict[str, Paper] = {
    # the five papers (the author lists and titles of their texts)
    "E3": Paper("Mengqi Liao, Xiangyu Xi, Ruinian Chen, Jia Leng, Yangen Hu, Ke Zeng, Shuai Liu, Huaiyu Wan",
                "Enhancing Efficiency and Exploration in Reinforcement Learning for LLMs", None, ("2",)),
    "ERPO": Paper("Song Yu, Li Li, Wenwen Zhao, Zhisheng Yang",
                  "ERPO: Token-Level Entropy-Regulated Policy Optimization for Large Reasoning Models", "2603.28204",
                  ("3",)),
    "CW-GRPO": Paper("Cheng Wang, Qin Liu, Wenxuan Zhou, Muhao Chen",
                     "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
                     "2605.11538", ("4",)),
    # the text is the anonymous submission under double-blind review
    "EAD": Paper("anonymous (under double-blind review)",
                 "Let it Calm: Exploratory Annealed Decoding for Verifiable Reinforcement Learning", None, ("6",)),
    "STILL": Paper("Jia Deng, Jie Chen, Zhipeng Chen, Daixuan Cheng, Fei Bai, Beichen Zhang, Yinqian Min, Yanzipeng "
                   "Gao, Wayne Xin Zhao, Ji-Rong Wen",
                   "From Trial-and-Error to Improvement: A Systematic Analysis of LLM Exploration Mechanisms in RLVR",
                   None, ("7", "8")),
    # the baselines, as docs/methods.md cites them
    "GRPO": Paper("Shao et al. 2024",
                  "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", None, ("1",)),
    "Dr.GRPO": Paper("Liu et al. 2025", "Understanding R1-Zero-like Training: A Critical Perspective", None, ("1a",)),
    "PPO": Paper("Schulman et al. 2017", "Proximal Policy Optimization Algorithms", None, ("1b",)),
    "Clip-Cov/KL-Cov": Paper("Cui et al. 2025",
                             "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", None,
                             ("5a", "5b")),
    "DAPO": Paper("Yu et al. 2025", "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", None, ("5c",)),
    "forking tokens": Paper("Wang et al. 2025", "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective "
                            "Reinforcement Learning for LLM Reasoning", None, ("5d",)),
    "entropy advantage": Paper("Cheng et al. 2025", "Reasoning with Exploration: An Entropy Perspective", None,
                               ("5e",)),
    "pass@k training": Paper("Chen et al. 2025", "Pass@k Training for Adaptively Balancing Exploration and "
                             "Exploitation of Large Reasoning Models", None, ("5f",)),
    # what verl 0.9.1 and TRL 1.16 ship beside them (issue 52)
    "GSPO": Paper("Chujie Zheng, Shixuan Liu, Mingze Li, Xiong-Hui Chen, Bowen Yu, Chang Gao, Kai Dang, Yuqiong Liu, "
                  "Rui Men, An Yang, Jingren Zhou, Junyang Lin", "Group Sequence Policy Optimization", "2507.18071",
                  ("5g",)),
    # CISPO's paper; its author list (the MiniMax team, over a hundred names) is shortened
    "MiniMax-M1": Paper("MiniMax, Aili Chen, Aonian Li, Bangwei Gong et al.",
                        "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", "2506.13585",
                        ("5h",)),
    "SAPO": Paper("Chang Gao, Chujie Zheng, Xiong-Hui Chen, Kai Dang, Shixuan Liu, Bowen Yu, An Yang, Shuai Bai, "
                  "Jingren Zhou, Junyang Lin", "Soft Adaptive Policy Optimization", "2511.20347", ("5i",)),
    # verl 0.9.1's advantage estimators (issue 52); arXiv ids as verl's code cites them (GPG: its paper's page)
    "RLOO": Paper("Ahmadian et al. 2024", "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from "
                  "Human Feedback in LLMs", "2402.14740", ("5n",)),
    "ReMax": Paper("Li et al. 2023", "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for "
                   "Aligning Large Language Models", "2310.10505", ("5n",)),
    "REINFORCE++": Paper("Hu 2025", "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
                         "2501.03262", ("5o",)),
    "OPO": Paper("Hao et al. 2025", "On-Policy RL with Optimal Reward Baseline", "2505.23585", ("5p",)),
    "GPG": Paper("Chu et al. 2025", "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
                 "2504.02546", ("5q",)),
    "GDPO": Paper("Liu et al. 2026", "GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward "
                  "RL Optimization", "2601.05242", ("5r",)),
    "OTB": Paper("Yingru Li, Jiawei Xu, Ziniu Li et al.", "The Optimal Token Baseline: Variance Reduction for "
                 "Long-Horizon LLM-RL", None, ("5s",)),
    # verl 0.9.1's policy losses DPPO, GMPO and DRO (issue 52); arXiv ids as verl's code cites them (DRO: Tinker's
    # documentation of the same loss); GPG's loss cites "GPG" above
    "DPPO": Paper("Penghui Qi, Xiangxin Zhou, Zichen Liu, Tianyu Pang, Chao Du, Min Lin, Wee Sun Lee",
                  "Rethinking the Trust Region in LLM Reinforcement Learning", "2602.04879", ("5j",)),
    "GMPO": Paper("Yuzhong Zhao, Yue Liu, Junpeng Liu, Jingye Chen, Xun Wu, Yaru Hao, Tengchao Lv, Shaohan Huang, "
                  "Lei Cui, Qixiang Ye et al.", "Geometric-Mean Policy Optimization", "2507.20673", ("5k",)),
    "DRO": Paper("Richemond et al. 2024",
                 "Offline Regularised Reinforcement Learning for Large Language Models Alignment", "2405.19107",
                 ("5l",)),
    # rollout correction (issue 52): verl's `rollout_corr_helper` cites the first (a blog post, no arXiv id recorded),
    # TRL's `off_policy_mask_threshold` the second (its arXiv id as TRL's GRPOConfig cites it)
    "When Speed Kills Stability": Paper("Liu, Li, Fu, Wang, Liu, Shen 2025", "When Speed Kills Stability: "
                                        "Demystifying RL Collapse from the Training-Inference Mismatch", None,
                                        ("6d",)),
    "DeepSeek-V3.2": Paper("DeepSeek-AI 2025", "DeepSeek-V3.2", "2512.02556", ("6d",)),
    # TRL 1.16's sequence-level losses LUSPO and VESPO (issue 52; arXiv ids as TRL's GRPOConfig cites them)
    "LUSPO": Paper("Fanfan Liu, Youyang Yin, Peng Shi, Siqi Yang, Zhixiong Zeng, Haibo Qiu",
                   "Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response Length Variation "
                   "in RLVR", "2602.05261", ("5y",)),
    "VESPO": Paper("Guobin Shen, Chenxiao Zhao, Xiang Cheng, Lei Huang, Xing Yu",
                   "VESPO: Variational Sequence-Level Soft Policy Optimization for Stable Off-Policy LLM Training",
                   "2602.10693", ("5y",)),
    # verl 0.9.1's `grpo_passk` estimator (issue 52; the arXiv id as verl's code cites it)
    "inference-time objectives": Paper("Yunhao Tang, Kunhao Zheng, Gabriel Synnaeve, Rémi Munos",
                                       "Optimizing Language Models for Inference Time Objectives using Reinforcement "
                                       "Learning", "2503.19595", ("5z",)),
    # exploration methods (issue 53, item 3); authors, titles and arXiv ids as each paper's abstract page (NSR,
    # QAE, RL-ZVP, SimKO) or the authors' LaTeX source (MaxRL) gives them
    "NSR": Paper("Xinyu Zhu, Mengzhou Xia, Zhepei Wei, Wei-Lin Chen, Danqi Chen, Yu Meng",
                 "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning", "2506.01347", ("5t",)),
    "QAE": Paper("Junkang Wu, Kexin Huang, Jiancan Wu, An Zhang, Xiang Wang, Xiangnan He",
                 "Quantile Advantage Estimation for Entropy-Safe Reasoning", "2509.22611", ("5u",)),
    "RL-ZVP": Paper("Thanh-Long V. Le, Myeongho Jeon, Kim Vu, Viet Lai, Eunho Yang",
                    "No Prompt Left Behind: Exploiting Zero-Variance Prompts in LLM Reinforcement Learning via "
                    "Entropy-Guided Advantage Shaping", "2509.21880", ("5v",)),
    "SimKO": Paper("Ruotian Peng, Yi Ren, Zhouliang Yu, Weiyang Liu, Yandong Wen",
                   "SimKO: Simple Pass@K Policy Optimization", "2510.14807", ("5w",)),
    "MaxRL": Paper("Fahim Tajwar, Guanning Zeng, Yueer Zhou, Yuda Song, Daman Arora, Yiding Jiang, Jeff Schneider, "
                   "Ruslan Salakhutdinov, Haiwen Feng, Andrea Zanette", "Maximum Likelihood Reinforcement Learning",
                   "2602.02710", ("5x",)),
    # issue 53, item 3: the training loop's adaptive entropy coefficient and reference reset (not registry entries);
    # arXiv ids as TRL 1.16's GRPOConfig cites Skywork-OR1 and as ProRL's abstract page gives it
    "Skywork-OR1": Paper("He et al. 2025", "Skywork Open Reasoner 1 Technical Report", "2505.22312", ("5aa",)),
    # FR3E (its arXiv abstract page's authors, title and id): branching rollouts from high-entropy tokens
    "FR3E": Paper("Tianyu Zheng, Tianshun Xing, Qingshui Gu, Taoran Liang, Xingwei Qu, Xin Zhou, Yizhi Li, Zhoufutu "
                  "Wen, Chenghua Lin, Wenhao Huang, Qian Liu, Ge Zhang, Zejun Ma", "First Return, Entropy-Eliciting "
                  "Explore", "2507.07017", ("5ad",)),
    "ProRL": Paper("Liu et al. 2025", "ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large "
                   "Language Models", "2505.24864", ("5ab",)),
    # outcome-based exploration (its arXiv abstract page's authors, title and id): bonuses by final answer
    "Outcome-based Exploration": Paper("Yuda Song, Julia Kempe, Remi Munos", "Outcome-based Exploration for LLM "
                                       "Reasoning", "2509.06941", ("5ac",)),
}
"""Short name -> the paper."""
