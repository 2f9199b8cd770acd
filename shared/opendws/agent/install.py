"""What a run needs on the VM before its command: a ``.tar.gz`` downloaded, checked and unpacked
once (GitHub's actions runner, at the version opendws pins).

The barrier's answer may carry ``"install": {"url", "sha256", "dir", "creates"}``. When
``dir/creates`` exists the install is done and nothing is downloaded. Otherwise the archive is
downloaded (https, or http to a loopback host only, redirects included; each socket operation
times out; a connection error, a timeout, a 5xx, 408 or 429 is tried again with backoff a few
times), its SHA-256 must be ``sha256``, and it is unpacked into a temporary directory beside
``dir`` which is renamed to ``dir`` once whole and holding ``creates``: a half-unpacked ``dir``
is never taken for a done one. A member that would land outside ``dir`` (an absolute name,
``..``, a path through a symlink, a symlink or hard link pointing out of it) or that is not a
file, a directory or a link (a device, a FIFO) is refused; files are owned by the agent's user,
without setuid, setgid, sticky or group/other write bits. Whatever fails is
:class:`InstallFailed`, saying what failed; the agent reports it as the job's exit.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import os
import shutil
import tarfile
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from opendws.agent.backoff import Backoff

DOWNLOAD_TIMEOUT_S = 30.0  # for each connect and each read
DOWNLOAD_ATTEMPTS = 4
CHUNK = 1024 * 1024
RETRIED_STATUSES = frozenset({408, 429})
FILE_MODE_MASK = 0o755  # no setuid, setgid, sticky, group or other write
DIR_MODE = 0o755


class InstallFailed(Exception):
    """The install failed: what failed (download, checksum, unpack) and why."""


class Cancelled(Exception):
    """The agent was told to stop while installing."""


@dataclass(frozen=True)
class Install:
    url: str
    sha256: str  # lower-case hex
    dir: str  # absolute, normalised, not "/"
    creates: str  # relative to dir, without ".."

    @property
    def marker(self) -> str:
        return os.path.join(self.dir, self.creates)

    @classmethod
    def parse(cls, value: object) -> Install:
        """The barrier's ``install`` object; ValueError saying what is wrong with it."""
        if not isinstance(value, Mapping):
            raise ValueError("install: an object with url, sha256, dir and creates")
        fields = {}
        for name in ("url", "sha256", "dir", "creates"):
            field = value.get(name)
            if not isinstance(field, str) or not field:
                raise ValueError(f"install.{name}: a non-empty string")
            fields[name] = field
        digest = fields["sha256"].lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError("install.sha256: 64 hexadecimal digits")
        folder = fields["dir"]
        if not os.path.isabs(folder) or os.path.normpath(folder) != folder or folder == "/":
            raise ValueError(f"install.dir: an absolute, normalised path other than /, "
                             f"not {folder!r}")  # fmt: skip
        creates = fields["creates"]
        if _escapes(creates):
            raise ValueError(f"install.creates: a path inside dir, not {creates!r}")
        return cls(fields["url"], digest, folder, os.path.normpath(creates))


def ensure(install: Install, say: Callable[[str], None], cancelled: threading.Event) -> bool:
    """Make sure ``install.dir/install.creates`` exists; whether it was installed now.
    Raises :class:`InstallFailed` or :class:`Cancelled`."""
    if os.path.lexists(install.marker):
        say(f"{install.marker} is there: nothing to install")
        return False
    parent, name = os.path.split(install.dir)
    try:
        os.makedirs(parent, exist_ok=True)
        fd, archive = tempfile.mkstemp(prefix=f".{name}.download-", dir=parent)
    except OSError as error:
        raise InstallFailed(f"download: cannot write in {parent}: {error}") from None
    try:
        with os.fdopen(fd, "w+b") as file:
            say(f"downloading {install.url}")
            digest = download(install.url, file, cancelled)
            if digest != install.sha256:
                raise InstallFailed(
                    f"checksum: {install.url} has SHA-256 {digest}, expected {install.sha256}"
                )
            file.seek(0)
            place(file, install, cancelled)
    finally:
        os.unlink(archive)
    say(f"installed {install.url} in {install.dir}")
    return True


# -- download ---------------------------------------------------------------------------------


def allowed_url(url: str) -> bool:
    """https, or http to a loopback host (localhost, 127.0.0.0/8, ::1)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return bool(parts.hostname)
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects (GitHub's release downloads redirect) only to allowed URLs."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        if not allowed_url(newurl):
            raise InstallFailed(f"download: redirected to {newurl}, which is not https")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_Redirects())


class _TryAgain(Exception):
    pass


def download(url: str, into: IO[bytes], cancelled: threading.Event) -> str:
    """Download ``url`` into ``into`` (emptied first); the SHA-256 of what came, in hex."""
    if not allowed_url(url):
        raise InstallFailed(f"download: {url} is not https (http only to a loopback host)")
    backoff = Backoff()
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        into.seek(0)
        into.truncate()
        try:
            return _fetch(url, into, cancelled)
        except _TryAgain as error:
            if attempt == DOWNLOAD_ATTEMPTS:
                raise InstallFailed(f"download: {error} ({attempt} attempts)") from None
        if cancelled.wait(backoff.next_delay()):
            raise Cancelled()
    raise AssertionError("unreachable")


def _fetch(url: str, into: IO[bytes], cancelled: threading.Event) -> str:
    digest = hashlib.sha256()
    request = urllib.request.Request(url, headers={"User-Agent": "opendws-agent"})
    try:
        with _OPENER.open(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
            while True:
                if cancelled.is_set():
                    raise Cancelled()
                chunk = response.read(CHUNK)
                if not chunk:
                    return digest.hexdigest()
                digest.update(chunk)
                into.write(chunk)
    except urllib.error.HTTPError as error:
        error.close()
        if error.code >= 500 or error.code in RETRIED_STATUSES:
            raise _TryAgain(f"HTTP {error.code} from {url}") from None
        raise InstallFailed(f"download: HTTP {error.code} from {url}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise _TryAgain(f"{url}: {error}") from None


# -- unpack -----------------------------------------------------------------------------------


def place(archive: IO[bytes], install: Install, cancelled: threading.Event) -> None:
    """Unpack ``archive`` beside ``install.dir`` and rename it into place once whole."""
    parent, name = os.path.split(install.dir)
    try:
        staging = tempfile.mkdtemp(prefix=f".{name}.unpack-", dir=parent)
    except OSError as error:
        raise InstallFailed(f"unpack: cannot write in {parent}: {error}") from None
    try:
        unpack(archive, staging, cancelled)
        if not os.path.lexists(os.path.join(staging, install.creates)):
            raise InstallFailed(f"unpack: the archive has no {install.creates}")
        os.chmod(staging, DIR_MODE)
        try:
            os.rename(staging, install.dir)
        except OSError as error:
            if os.path.lexists(install.marker):
                return  # installed meanwhile by another
            raise InstallFailed(
                f"unpack: cannot put it in place at {install.dir}: {error}"
            ) from None
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)


def unpack(archive: IO[bytes], root: str, cancelled: threading.Event) -> None:
    """Unpack the gzipped tar ``archive`` into the empty directory ``root``, member by member,
    refusing any member that would land or point outside it."""
    root = os.path.realpath(root)
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            for member in tar:
                if cancelled.is_set():
                    raise Cancelled()
                _unpack_member(tar, member, root)
    except (tarfile.TarError, EOFError, OSError, ValueError) as error:
        raise InstallFailed(f"unpack: {error}") from None
    _refuse_links_out(root)


def _escapes(relative: str) -> bool:
    """Whether the archive path ``relative`` is absolute or climbs out with ``..``."""
    if os.path.isabs(relative):
        return True
    normal = os.path.normpath(relative)
    return normal == ".." or normal.startswith(".." + os.sep)


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _make_parents(root: str, relative: str, name: str) -> str:
    """Make the directories above ``relative`` (each a real directory: never a path through
    a symlink, which could lead anywhere); the one it goes in."""
    path = root
    head = os.path.dirname(relative)
    for part in head.split(os.sep) if head else []:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise InstallFailed(f"unpack: {name!r} goes through a symlink")
        if not os.path.lexists(path):
            os.mkdir(path, DIR_MODE)
        elif not os.path.isdir(path):
            raise InstallFailed(f"unpack: {name!r} goes through a file")
    return path


def _unpack_member(tar: tarfile.TarFile, member: tarfile.TarInfo, root: str) -> None:
    if _escapes(member.name):
        raise InstallFailed(f"unpack: {member.name!r} is outside the directory")
    relative = os.path.normpath(member.name)
    if relative == ".":
        return  # the root itself
    parent = _make_parents(root, relative, member.name)
    target = os.path.join(root, relative)
    if member.isdir():
        if os.path.islink(target):
            raise InstallFailed(f"unpack: {member.name!r} is a symlink and a directory")
        if not os.path.isdir(target):
            os.mkdir(target, DIR_MODE)
        return
    if os.path.lexists(target):
        raise InstallFailed(f"unpack: {member.name!r} is in the archive twice")
    if member.issym():
        if os.path.isabs(member.linkname) or not _inside(
            root, os.path.normpath(os.path.join(parent, member.linkname))
        ):
            raise InstallFailed(
                f"unpack: the symlink {member.name!r} points out of the directory "
                f"({member.linkname!r})"
            )
        os.symlink(member.linkname, target)
    elif member.islnk():
        source = os.path.join(root, os.path.normpath(member.linkname))
        if _escapes(member.linkname) or os.path.realpath(source) != source:
            raise InstallFailed(
                f"unpack: the hard link {member.name!r} points out of the directory "
                f"({member.linkname!r})"
            )
        if not os.path.isfile(source):
            raise InstallFailed(f"unpack: the hard link {member.name!r} names no file before it")
        os.link(source, target)
    elif member.isreg():
        _write_file(tar, member, target)
    else:
        raise InstallFailed(f"unpack: {member.name!r} is neither a file, a directory nor a link")


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str) -> None:
    source = tar.extractfile(member)
    assert source is not None  # a regular member always has its data
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    mode = member.mode & FILE_MODE_MASK
    fd = os.open(target, flags, mode)
    with source, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, CHUNK)
    os.chmod(target, mode)  # whatever the umask took away


def _refuse_links_out(root: str) -> None:
    """Once all is unpacked, no symlink may resolve out of ``root`` (a chain of links, each
    inside on its own, can)."""
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path) and not _inside(root, os.path.realpath(path)):
                relative = os.path.relpath(path, root)
                raise InstallFailed(f"unpack: the symlink {relative!r} points out of the directory")
