"""s3fs over moto: the filesystem fsmingle refuses."""

from __future__ import annotations

import os
import subprocess
import time

from .capabilities import MOTO_VENV_DEFAULT, MOTO_VENV_ENV, moto_server_path
from .fs_base import _FsBackend
from .plumbing import (
    _free_port_block,
)


class _S3fs(_FsBackend):
    """s3fs-fuse over a local S3 server (moto).  Not a filesystem fsmingle can use: no link(),
    O_EXCL not exclusive across mounts; the refusal tests run on it."""

    fs = "s3fs"
    fuse_type = "fuse.s3fs"

    def start(self) -> None:
        import urllib.request

        c = self.c
        b = c.workdir / "s3"
        b.mkdir()
        moto = moto_server_path()
        if not os.access(moto, os.X_OK):
            raise RuntimeError(
                f"{moto} missing: python3 -m venv {MOTO_VENV_DEFAULT} && "
                f"{MOTO_VENV_DEFAULT}/bin/pip install 'moto[server]' (or set ${MOTO_VENV_ENV})"
            )
        self.port = _free_port_block(1)
        d = subprocess.Popen(
            [moto, "-H", self.server_ip, "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=open(b / "moto.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        c.track_pid(d.pid)
        c._daemons.append(d)
        url = f"http://{self.server_ip}:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(f"{url}/fsmbucket", method="PUT"), timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or d.poll() is not None:
                    raise RuntimeError("moto_server did not start:\n" + (b / "moto.log").read_text()[-2000:])
                time.sleep(0.1)
        pw = b / "passwd"
        pw.write_text("fsmkey:fsmsecret\n")
        pw.chmod(0o600)  # s3fs refuses a password file others can read
        self.opts = f"url={url},use_path_request_style,passwd_file={pw},allow_other,umask=0022"
        self.base = b

    def client_argv(self, mnt: str) -> list[str]:
        return ["s3fs", "fsmbucket", mnt, "-o", self.opts]
