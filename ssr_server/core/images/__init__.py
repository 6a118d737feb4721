"""Image intake: limits (``limits``), SSRF-safe URL fetching (``urls``), bounded decoding (``intake``)."""
