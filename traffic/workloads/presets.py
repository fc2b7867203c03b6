"""Published open models as training presets (pure): ``training: {preset: llama3-8b}``.

Each preset is the model's shape as its paper or released configuration states it (layers,
hidden size, attention heads, parameters, the sequence length it was trained at; for MoE
models the experts, the experts per token and which layers are MoE). A preset fills the
fields it knows; fields the experiment gives beside it win (parallelism, micro-batches,
compute, ...). ``size_scale`` is the one knob that fits a real model to an emulated fabric:
it multiplies every byte the iteration moves (activations, gradients, tokens) and nothing
else, so the collectives keep their number and pattern while their sizes shrink to what
megabit links carry in seconds (a Llama 3 8B gradient all-reduce of 16 GB at 1e-4: 1.6 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    """One model's shape and where it is stated."""

    layers: int
    hidden: int
    heads: int
    params: int  # all parameters (MoE: every expert's)
    seq_len: int
    source: str
    experts: int = 0  # routed experts per MoE layer (0: dense)
    top_k: int = 0
    moe_every: int = 0  # every n-th layer is MoE (1: all)
    active_params: int = 0  # MoE: parameters a token uses

    def fields(self) -> dict:
        """The TrainingSpec fields the preset sets."""
        out = {"layers": self.layers, "hidden": self.hidden, "params": self.params,
               "seq_len": self.seq_len}
        if self.experts:
            out |= {"experts": self.experts, "top_k": self.top_k, "moe_every": self.moe_every}
        return out


PRESETS = {
    "llama2-7b": Preset(32, 4096, 32, 6_738_000_000, 4096,
                        "Touvron et al., Llama 2 (2023), table 1 and the released config"),
    "llama3-8b": Preset(32, 4096, 32, 8_030_000_000, 8192,
                        "Llama 3 herd of models (2024), table 3; config.json of Meta-Llama-3-8B"),
    "llama3-70b": Preset(80, 8192, 64, 70_550_000_000, 8192,
                         "Llama 3 herd of models (2024), table 3; config.json of Meta-Llama-3-70B"),
    "gpt3-175b": Preset(96, 12288, 96, 175_000_000_000, 2048,
                        "Brown et al., Language Models are Few-Shot Learners (2020), table 2.1"),
    "mixtral-8x7b": Preset(32, 4096, 32, 46_700_000_000, 32768,
                           "Jiang et al., Mixtral of Experts (2024), table 1", experts=8,
                           top_k=2, moe_every=1, active_params=12_900_000_000),
    "deepseek-v3": Preset(61, 7168, 128, 671_000_000_000, 4096,
                          "DeepSeek-V3 technical report (2024), section 4.2 (256 routed "
                          "experts, 8 per token; the shared expert and the first three dense "
                          "layers are not modelled apart)", experts=256, top_k=8, moe_every=1,
                          active_params=37_000_000_000),
}


def resolve(raw: dict, field: str = "workload.training") -> dict:
    """A ``training`` section with its preset's fields filled in (the section's own win);
    ``size_scale`` stays for the generator. Unknown presets are named with the known ones."""
    name = raw.get("preset")
    if name is None:
        return dict(raw)
    if name not in PRESETS:
        raise ConfigError(f"{field}.preset", f"unknown preset {name!r}; known: "
                                             f"{', '.join(sorted(PRESETS))}")
    out = {**PRESETS[name].fields(), **{k: v for k, v in raw.items() if k != "preset"}}
    return out
