"""Images through both APIs with the official clients: data URLs / base64, URL policy, bad images."""

import base64
import http.server
import io
import threading

import httpx
import numpy as np
import PIL.Image
import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def _png(seed, w=80, h=48) -> bytes:
    buf = io.BytesIO()
    PIL.Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _oa(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def _an(base):
    return anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)


def _openai_image(url, text="what is this?"):
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def _anthropic_image(data, text="what is this?"):
    return [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(data).decode()}},
        {"type": "text", "text": text}]}]


def test_same_image_same_answer_in_both_dialects_and_streams(vision_server):
    base, _, media = vision_server
    image = _png(1)
    encoded = media.misses
    r = _oa(base).chat.completions.create(model="tiny", messages=_openai_image(_data_url(image)), max_tokens=6,
                                          temperature=0)
    text_only = _oa(base).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "what is this?"}],
                                                  max_tokens=6, temperature=0)
    assert r.usage.prompt_tokens > text_only.usage.prompt_tokens  # the image's placeholders are in the prompt
    m = _an(base).messages.create(model="tiny", messages=_anthropic_image(image), max_tokens=6,
                                  extra_body={"temperature": 0})
    assert m.content[0].text == r.choices[0].message.content
    count = _an(base).messages.count_tokens(model="tiny", messages=_anthropic_image(image)).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == count == r.usage.prompt_tokens
    chunks = list(_oa(base).chat.completions.create(model="tiny", messages=_openai_image(_data_url(image)),
                                                    max_tokens=6, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert media.misses == encoded + 1  # later requests reuse the prefix (or the encoder cache): encoded once


def test_follow_up_turn_reuses_the_prefix_with_the_image(vision_server):
    base, _, _ = vision_server
    image = _png(2)
    first = _an(base).messages.create(model="tiny", messages=_anthropic_image(image, "describe"), max_tokens=4,
                                      extra_body={"temperature": 0})
    follow = _anthropic_image(image, "describe") + [{"role": "assistant", "content": first.content[0].text or "ok"},
                                                    {"role": "user", "content": "more"}]
    second = _an(base).messages.create(model="tiny", messages=follow, max_tokens=4, extra_body={"temperature": 0})
    assert second.usage.cache_read_input_tokens > 0
    other = _anthropic_image(_png(3), "describe") + follow[1:]  # another image, same text: no reuse past it
    third = _an(base).messages.create(model="tiny", messages=other, max_tokens=4, extra_body={"temperature": 0})
    assert third.usage.cache_read_input_tokens < second.usage.cache_read_input_tokens


@pytest.mark.parametrize("url,match", [
    ("data:image/png;base64,%%%not-base64", "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "not an image"),
    ("data:image/png;base64," + base64.b64encode(_png(4)[:200]).decode(), "could not be decoded"),
    ("ftp://example.com/cat.png", "unsupported image URL scheme"),
])
def test_bad_images_are_400(vision_server, url, match):
    base, _, _ = vision_server
    with pytest.raises(openai.BadRequestError, match=match):
        _oa(base).chat.completions.create(model="tiny", messages=_openai_image(url), max_tokens=2)


def test_huge_images_are_400_in_both_dialects(vision_server):
    base, _, _ = vision_server
    buf = io.BytesIO()
    PIL.Image.new("L", (9000, 5000)).save(buf, "PNG")  # 45 Mpx in a few KB
    with pytest.raises(openai.BadRequestError, match="over the limit"):
        _oa(base).chat.completions.create(model="tiny", messages=_openai_image(_data_url(buf.getvalue())),
                                          max_tokens=2)
    with pytest.raises(anthropic.BadRequestError, match="over the limit"):
        _an(base).messages.create(model="tiny", messages=_anthropic_image(buf.getvalue()), max_tokens=2)


def test_remote_urls_fetched_only_when_allowed(vision_server, make_server):
    base, _, _ = vision_server
    image = _png(5)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.end_headers()
            self.wfile.write(image)

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}/cat.png"
    try:
        fetched = _oa(base).chat.completions.create(model="tiny", messages=_openai_image(url), max_tokens=4,
                                                    temperature=0)
        inline = _oa(base).chat.completions.create(model="tiny", messages=_openai_image(_data_url(image)),
                                                   max_tokens=4, temperature=0)
        assert fetched.choices[0].message.content == inline.choices[0].message.content
    finally:
        srv.shutdown()
    with make_server() as (plain, _):  # no --vision at all
        with pytest.raises(openai.BadRequestError, match="--vision"):
            _oa(plain).chat.completions.create(model="tiny", messages=_openai_image(_data_url(image)), max_tokens=2)


def test_remote_urls_refused_by_default(tiny_artifact):
    from ninfer_run.cli import _vision_support
    from ninfer_run.loader import load
    from tests.server.conftest import _app, serving

    loaded = load(tiny_artifact, vision=True)
    app, _, _ = _app(tiny_artifact, loaded.model, vision=_vision_support(loaded, 64, 256, allow_urls=False))
    with serving(app) as base:
        r = httpx.post(f"{base}/v1/messages", json={"model": "t", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/cat.png"}}]}]})
    assert r.status_code == 400 and "--allow-image-urls" in r.json()["error"]["message"]
