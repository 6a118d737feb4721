"""The embedded engine: transformers model, packed candidate scoring, prefix KV cache, batched scheduler.

Layout after nano-vllm and mini-sglang, one concept per module:

- ``config``: ``EngineConfig``, the one frozen configuration (device, dtype, budgets, pacing, cache, limit);
- ``loader``: weights, tokenizer, image processor; the text decoder loaded with the segmented attention;
- ``multimodal``: compact context -> expanded ids, image tensors and (M-RoPE) positions;
- ``kv``: growable per-sequence KV buffers; ``radix`` + ``prefix_cache``: LRU of contexts, radix lookup;
- ``segments``: attention per cached past, registered with transformers under its own name;
- ``runner`` + ``scoring``: one packed forward for many chunks; prefill, packed candidate scoring;
- ``jobs``, ``batch``, ``prefill_queue``, ``pacing``, ``decode``, ``grammar``: what the scheduler trades,
  packs, queues, paces, samples and constrains;
- ``scheduler``: one worker thread, one forward per step under the budgets; ``engine``: the async protocol.
"""
