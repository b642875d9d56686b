"""The bash every backend writes the same way, run by a real bash."""

from __future__ import annotations

import subprocess

from corral.infra.shell import write_file

CONTENTS = {
    "script.sh": "#!/bin/bash\necho 'single' \"double\" $HOME `uname` $(touch ran)\n",
    "no-final-newline": "last line",
    "empty": "",
    "blank-lines": "\n\n  indented\t\ttabs\n\n",
    "unicode": "héllo — wörld ✓\n",
    "looks-like-a-delimiter": "CORRAL_EOF_0123456789abcdef\nEOF\n'\n",
}


def test_files_are_written_byte_for_byte_and_nothing_in_them_runs(tmp_path):
    script = 'd="$1"\n' + "\n".join(write_file(f'"$d"/{name}', content) for name, content in CONTENTS.items())
    done = subprocess.run(["bash", "-s", "--", str(tmp_path)], input=script, capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name, content in CONTENTS.items():
        assert (tmp_path / name).read_bytes() == content.encode(), name
    assert not (tmp_path / "ran").exists()


def test_any_text_arrives_exactly(tmp_path):
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=60, deadline=None)
    @given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=300))
    def arrives(content: str) -> None:
        target = tmp_path / "f"
        done = subprocess.run(["bash", "-s", "--", str(target)], input=write_file('"$1"', content).encode(),
                              capture_output=True)
        assert done.returncode == 0 and target.read_bytes() == content.encode()

    arrives()
