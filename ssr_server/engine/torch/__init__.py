"""The embedded engine: transformers model, packed candidate scoring, prefix KV cache, batched scheduler.

Layout follows nano-vllm: ``loader`` (weights, tokenizer, processor), ``multimodal`` (compact context ->
model inputs), ``kv`` (growable per-sequence KV buffers and the cache object handed to transformers),
``prefix_cache`` (LRU of contexts), ``runner`` (one packed forward for many chunks), ``scheduler`` (one
worker thread that batches work from concurrent runs), ``engine`` (the async Engine protocol).
"""
