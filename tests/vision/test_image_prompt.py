"""An image + text prompt end to end on the reference path, against transformers' Qwen3.5 model."""

import io
import json

import numpy as np
import PIL.Image
import pytest
import torch

from ninfer_run.chat import Chat
from ninfer_run.loader import load
from ninfer_run.state import SequenceState
from ninfer_run.vision.preprocess import ImageConfig, decode, prepare
from ninfer_run.vision.prompt import cache_key, expand, multimodal_prompt

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tiny_checkpoints, packed):
    path = packed("tiny-qwen3.5", "bf16")
    loaded = load(path, vision=True)
    chat = Chat.from_artifact(loaded.artifact)
    config = loaded.artifact.manifest.config
    images_cfg = ImageConfig.from_preprocessor(json.loads(loaded.artifact.blob("preprocessor_config.json")))
    hf = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tiny_checkpoints["tiny-qwen3.5"],
                                                                      dtype=torch.float32).eval()
    return loaded, chat, config, images_cfg, hf


def _image(w, h, seed):
    array = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PIL.Image.fromarray(array).save(buf, format="PNG")
    return decode(buf.getvalue())


@pytest.mark.parametrize("sizes", [[(70, 50)], [(64, 200), (130, 90)]])
def test_logits_match_transformers(setup, sizes):
    loaded, chat, config, images_cfg, hf = setup
    merge, image_id = config["vision_config"]["spatial_merge_size"], config["image_token_id"]
    images = tuple(prepare(_image(w, h, i), images_cfg) for i, (w, h) in enumerate(sizes))
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": "what is in the picture?"}]
    tokens = expand(chat.encode(chat.render([{"role": "user", "content": content}])), image_id, images, merge)
    mm = multimodal_prompt(tokens, image_id, images, merge)
    mm.embeds = torch.cat([loaded.vision.forward(im.pixels, im.grid) for im in images])
    state = SequenceState(mm=mm)
    _, logits = loaded.model.forward(torch.tensor(tokens), state)
    # decode two more tokens: positions continue at index + rope_delta
    nxt = [int(logits[-1].argmax())]
    _, step = loaded.model.forward(torch.tensor(nxt), state)
    ids = torch.tensor([tokens + nxt])
    with torch.no_grad():
        ref = hf(input_ids=ids, pixel_values=torch.cat([im.pixels for im in images]),
                 image_grid_thw=torch.tensor([im.grid for im in images]),
                 mm_token_type_ids=(ids == image_id).int()).logits[0]
    ours = torch.cat([logits, step])
    assert float((ours - ref).abs().max() / ref.abs().max()) < 1e-4
    # the image changes the answer (the test would pass vacuously if embeddings were ignored)
    _, plain = loaded.model.forward(torch.tensor(tokens), SequenceState())
    assert float((plain[-1] - logits[-1]).abs().max()) > 1e-3


def test_cache_key_separates_images_and_keeps_text(setup):
    _, _, config, images_cfg, _ = setup
    merge, image_id = config["vision_config"]["spatial_merge_size"], config["image_token_id"]
    a, b = prepare(_image(64, 64, 1), images_cfg), prepare(_image(64, 64, 2), images_cfg)
    tokens = [5, 9] + [image_id] * a.tokens(merge) + [10, 7]
    ka, kb = cache_key(tokens, image_id, (a,), merge), cache_key(tokens, image_id, (b,), merge)
    assert ka[:2] == kb[:2] == [5, 9] and ka[-2:] == kb[-2:] == [10, 7]
    assert all(k < 0 for k in ka[2:-2]) and ka[2:-2] != kb[2:-2] and len(set(ka[2:-2])) == a.tokens(merge)
    assert cache_key(tokens, image_id, (a,), merge) == ka
