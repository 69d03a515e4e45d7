"""Vision: image preprocessing, the vision tower (reference path), the media cache, and M-RoPE prompts."""
