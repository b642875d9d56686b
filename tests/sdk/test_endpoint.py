"""endpoint.py: which server a Client talks to, and a server URL checked wherever it is given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.errors import ConfigError
from corral.sdk import Client
from corral.sdk.endpoint import remote, server_url


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765", "https://corral.example.org/", "http://[::1]:80",
                                 "https://proxy.example.org/corral/"])
def test_a_servers_url_is_taken_without_its_trailing_slash(url):
    assert server_url(url, "URL") == url.rstrip("/")


@pytest.mark.parametrize("url", ["notaurl", "ftp://x", "http://", "http://h:99999", "http://h:0", "http://h:x",
                                 "http://h/?a=1", "http://h/#top", "http://h /", "127.0.0.1:8765"])
def test_anything_else_is_refused_naming_where_it_came_from(url):
    with pytest.raises(ConfigError, match="^CORRAL_API_URL .* is not a Corral server's URL; give one such as"):
        server_url(url, "CORRAL_API_URL")


@given(st.text(max_size=60))
def test_any_text_is_a_url_or_a_config_error(text):
    """`CORRAL_API_URL=notaurl corral queue` was an internal error (urllib's ValueError)."""
    try:
        assert server_url(text, "URL") == text.rstrip("/")
    except ConfigError:
        pass


def test_the_environment_and_the_client_are_checked_and_say_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.setenv("CORRAL_API_URL", "notaurl")
    with pytest.raises(ConfigError, match="^CORRAL_API_URL 'notaurl'"):
        Client()
    monkeypatch.setenv("CORRAL_API_URL", "http://127.0.0.1:9")
    assert remote().remedy == "check CORRAL_API_URL, or unset it to use the local server"
    assert remote("http://127.0.0.1:9/").url == "http://127.0.0.1:9"
    with pytest.raises(ConfigError, match="^the URL 'x'"):
        Client("x")
