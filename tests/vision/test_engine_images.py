"""Image requests through the engine: same tokens as a direct run, reuse keyed by image content,
encoder outputs cached within the media budget."""

import io
import json

import numpy as np
import PIL.Image
import pytest
import torch

from ninfer_run.chat import Chat
from ninfer_run.engine import EngineConfig, Request, RequestRejected, build_engine
from ninfer_run.loader import load
from ninfer_run.state import SequenceState
from ninfer_run.vision.media import MediaEncoder
from ninfer_run.vision.preprocess import ImageConfig, ImageError, decode, prepare
from ninfer_run.vision.prompt import cache_key, expand, multimodal_prompt


@pytest.fixture(scope="module")
def parts(packed):
    loaded = load(packed("tiny-qwen3.5", "bf16"), vision=True)
    chat = Chat.from_artifact(loaded.artifact)
    cfg = ImageConfig.from_preprocessor(json.loads(loaded.artifact.blob("preprocessor_config.json")))
    return loaded, chat, cfg, loaded.artifact.manifest.config


def _image(seed, w=64, h=96):
    buf = io.BytesIO()
    PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _request(parts, seed, text, max_tokens=6):
    _, chat, cfg, config = parts
    merge, image_id = config["vision_config"]["spatial_merge_size"], config["image_token_id"]
    images = (prepare(decode(_image(seed)), cfg),)
    content = [{"type": "image"}, {"type": "text", "text": text}]
    tokens = expand(chat.encode(chat.render([{"role": "user", "content": content}])), image_id, images, merge)
    # a frontier one token before the end, as the server keeps one where the generation prompt starts
    return Request(tokens, max_tokens=max_tokens, mm=multimodal_prompt(tokens, image_id, images, merge),
                   cache_key=cache_key(tokens, image_id, images, merge), snapshot_at=(len(tokens) - 1,))


def _engine(parts, cache_mib=64):
    loaded = parts[0]
    media = MediaEncoder(loaded.vision, cache_mib << 20, 256 << 20)
    return build_engine(loaded.model, EngineConfig(max_context=2048, max_concurrency=2, prefill_chunk=16,
                                                   block_size=16), media=media), media


def _direct(parts, req):
    loaded = parts[0]
    mm = multimodal_prompt(req.prompt, parts[3]["image_token_id"], req.mm.images, 2)
    mm.embeds = torch.cat([loaded.vision.forward(im.pixels, im.grid) for im in mm.images])
    state = SequenceState(mm=mm)
    _, logits = loaded.model.forward(torch.tensor(req.prompt), state)
    out = []
    for _ in range(req.max_tokens):
        out.append(int(logits[-1].argmax()))
        _, logits = loaded.model.forward(torch.tensor(out[-1:]), state)
    return out


def test_chunked_batched_image_requests_equal_direct_runs(parts):
    engine, media = _engine(parts)
    reqs = [_request(parts, 1, "describe"), _request(parts, 2, "describe")]
    results = [engine.submit(r) for r in reqs]
    engine.run_until_done()
    assert [r.tokens for r in results] == [_direct(parts, r) for r in reqs]
    assert media.misses == 2 and media.hits == 0


def test_reuse_follows_the_image_not_the_placeholder_ids(parts):
    engine, media = _engine(parts)
    first = engine.submit(_request(parts, 1, "describe"))
    engine.run_until_done()
    again = engine.submit(_request(parts, 1, "describe"))  # same image and text: a frontier covers the prompt
    engine.run_until_done()
    other = _request(parts, 3, "describe")  # same token ids, another image
    different = engine.submit(other)
    engine.run_until_done()
    assert first.cached_tokens == 0 and again.cached_tokens > 0 and again.tokens == first.tokens
    image_start = int(other.mm.image_rows[0])
    assert different.cached_tokens <= image_start  # nothing past the first image placeholder is reused
    assert different.tokens == _direct(parts, other)
    assert media.misses == 2  # the repeated image was encoded once (or not at all when fully cached)


def test_media_cache_budget_and_live_budget(parts):
    loaded = parts[0]
    req = _request(parts, 4, "x")
    one = MediaEncoder(loaded.vision, 0, 256 << 20)
    one.encode(req.mm.images)
    one.encode(req.mm.images)
    assert one.misses == 2 and one.cached_bytes == 0  # a zero budget caches nothing
    tight = MediaEncoder(loaded.vision, 64 << 20, 1024)
    with pytest.raises(ImageError, match="media-live-mib"):
        tight.check(req.mm.images)


def test_images_without_a_vision_tower_are_rejected(parts):
    engine = build_engine(parts[0].model, EngineConfig(max_context=2048))
    with pytest.raises(RequestRejected, match="--vision"):
        engine.submit(_request(parts, 5, "x"))


def test_mtp_speculative_decoding_with_images_keeps_the_output(parts):
    loaded = parts[0]
    media = MediaEncoder(loaded.vision, 64 << 20, 256 << 20)
    engine = build_engine(loaded.model, EngineConfig(max_context=2048, block_size=16, draft_tokens=3), media=media)
    req = _request(parts, 6, "describe", max_tokens=12)
    result = engine.submit(req)
    engine.run_until_done()
    assert result.tokens == _direct(parts, req) and result.drafted > 0
