"""Next-token choice: greedy, or seeded temperature / top-k / top-p.

A temperature below ``SAMPLING_EPS`` is greedy, as in SGLang: dividing logits by 1e-197 gives
infinities whose softmax is NaN (a client sent exactly that, and got a 500 from ``multinomial``).
"""

from __future__ import annotations

import torch

from ssr_server.core.protocol import GenerationParams

SAMPLING_EPS = 1e-6


class Sampler:
    def __init__(self, params: GenerationParams, device: torch.device) -> None:
        self.params = params
        self.generator: torch.Generator | None = None
        if params.temperature >= SAMPLING_EPS:
            self.generator = torch.Generator(device=device)  # on the logits' device
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    @property
    def greedy(self) -> bool:
        return self.params.temperature < SAMPLING_EPS

    def __call__(self, logits: torch.Tensor) -> int:
        """Pick from ``logits`` (vocab,) float32, on the device the sampler was made for."""
        p = self.params
        if p.temperature < SAMPLING_EPS:
            return int(torch.argmax(logits))
        scaled = logits / p.temperature
        if p.top_k > 0:
            kth = torch.topk(scaled, min(p.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < p.top_p  # always keeps the top token
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=self.generator))

