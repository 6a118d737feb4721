"""Model engines: the embedded torch engine and the SGLang client share one protocol (``base.Engine``)."""
