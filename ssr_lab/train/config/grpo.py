"""``ssr-lab train grpo``'s recipe: SSR-GRPO through the real agent loop, from an SFT model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from ssr_lab.train.config.fields import RECIPE, Kinds, Share, ZoomStyle
from ssr_lab.train.objective import RatioLevel, SelectorGrad
from ssr_server.core.limits import DEFAULT_MAX_TURNS


@dataclass(frozen=True, config=RECIPE)
class GRPOConfig:
    """GRPO through the real agent loop; SSR turns contribute one categorical ratio each."""

    world: Annotated[Path, Field(description="a `world build` folder")]
    init: Annotated[Path, Field(description="the SFT model folder to start from")]
    out: Annotated[Path, Field(description="where the model goes (resumes from its checkpoints)")]
    format: Annotated[Literal["ssr", "freeform"], Field(description="the rollouts' form")] = "ssr"
    iterations: Annotated[int, Field(ge=1, description="rollout-and-update rounds")] = 20
    questions: Annotated[int, Field(ge=1, description="questions per iteration")] = 8
    group: Annotated[int, Field(ge=2, description="rollouts per question (G)")] = 8
    epochs: Annotated[int, Field(ge=1, description="update epochs per rollout batch")] = 2
    minibatch: Annotated[int, Field(ge=1, description="rollouts per optimizer step")] = 16
    lr: Annotated[float, Field(gt=0.0, description="learning rate")] = 1e-4
    clip: Annotated[float, Field(ge=0.0, description="PPO clip epsilon")] = 0.2
    gamma: Annotated[float, Field(description="weight of a selection decision against one action token")
                     ] = 1.0
    tau: Annotated[float, Field(ge=0.0, description=(
        "selection temperature of the rollouts (and of q in the ratio); > 0 in the ssr form"))] = 1.0
    temperature: Annotated[float, Field(ge=0.0, description="action sampling temperature of the rollouts")
                           ] = 1.0
    selector_grad: Annotated[SelectorGrad, Field(description="exact (all K scores) | detached (the paper)")
                             ] = "exact"
    ratio_level: Annotated[RatioLevel, Field(description="token (GRPO) | sequence (GSPO), for actions")
                           ] = "token"
    kl: Annotated[float, Field(ge=0.0, description="weight of the KL to the initial model on action tokens")
                  ] = 0.0
    format_reward: Annotated[float, Field(description="reward for answering at all")] = 0.1
    max_turns: Annotated[int, Field(ge=1, description="agent turns per rollout")] = DEFAULT_MAX_TURNS
    reasoning_budget: Annotated[int, Field(ge=1, description="freeform: reasoning tokens per turn")] = 96
    concurrency: Annotated[int, Field(ge=1, description="rollouts in flight")] = 8
    seed: Annotated[int, Field(description="seeds the questions drawn and the rollouts")] = 0
    max_minutes: Annotated[float, Field(description="wall-clock budget: saves and stops past it")] = 28.0
    threads: Annotated[int | None, Field(description="torch threads (null: all cores)")] = None
    kinds: Annotated[Kinds, Field(description=(
        "draw only questions of these kinds (empty: every kind); groups of a solved kind teach nothing"))
    ] = ()
    freeze_vision: Annotated[bool, Field(description=(
        "keep the vision tower as loaded: RL moves only how the language model uses what it sees"))] = False
    anchor: Annotated[float, Field(ge=0.0, description=(
        "weight of an SFT anchor: the oracle trajectories' cross-entropy (every kind) added at each "
        "step"))] = 0.0
    anchor_batch: Annotated[int, Field(ge=1, description="anchor trajectories per step")] = 16
    anchor_zoom: Annotated[ZoomStyle, Field(description=(
        "zoom style of the anchor's trajectories (the one the model was trained on)"))] = "tight"
    anchor_rename: Annotated[bool, Field(description="rename the anchor's entities (as sft's rename)")
                             ] = False
    anchor_rephrase: Annotated[Share, Field(description=(
        "share of the anchor's questions rephrased (as sft's rephrase)"))] = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.format == "ssr" and self.tau <= 0:
            raise ValueError("tau: must be > 0: the ssr ratio is over q = softmax(S / tau)")
        return self
