"""The cluster lock against an etcd that speaks TLS only, asks for client
certificates, and (in a second one) has authentication and RBAC enabled.
The certificates are made with openssl at test time (etcdtest.Certs)."""
import json
import os
import subprocess

import pytest

from conftest import LOOPLOCK, TIMEOUT, expect_line, run
from etcdtest import EX_UNAVAILABLE, Certs, cluster_args, fresh_name, needs_etcd, start_looplock, start_member

pytestmark = needs_etcd

PASSWORD = "pw-7f3c-secret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_etcd(certs):
    m = start_member(certs=certs)
    yield m
    m.remove()


@pytest.fixture(scope="module")
def rbac_etcd(certs):
    """TLS, client certificates, and authentication: root, and user "loop"
    with read-write on looplock/ only; user "nobody" without a role."""
    m = start_member(certs=certs)
    try:
        for args in (["user", "add", "root:rootpw"], ["user", "grant-role", "root", "root"],
                     ["user", "add", f"loop:{PASSWORD}"], ["role", "add", "looplock"],
                     ["role", "grant-permission", "looplock", "--prefix=true", "readwrite", "looplock/"],
                     ["user", "grant-role", "loop", "looplock"], ["user", "add", "nobody:nobodypw"],
                     ["auth", "enable"]):
            r = m.ctl(*args)
            assert r.returncode == 0, (args, r.stderr)
        yield m
    finally:
        m.remove()


def tls_args(certs, cn=True):
    if cn:
        return ["--etcd-cacert", certs.ca, "--etcd-cert", certs.client, "--etcd-key", certs.client_key]
    return ["--etcd-cacert", certs.ca, "--etcd-cert", certs.client_nocn, "--etcd-key", certs.client_nocn_key]


def test_tls_with_client_certificates(tls_etcd, certs, tmp_path):
    name = fresh_name()
    a = start_looplock([*cluster_args(tls_etcd.url, name), *tls_args(certs), "-p", "blocking", tmp_path, "--", "sh",
                        "-c", "echo ready; cat >/dev/null"])
    try:
        expect_line(a, "ready")
        other = tmp_path / "other"
        other.mkdir()
        # The same files from the environment; the lock is held: a skip.
        env = {"LOOPLOCK_ETCD_CACERT": str(certs.ca), "LOOPLOCK_ETCD_CLIENT_CERT": str(certs.client),
               "LOOPLOCK_ETCD_CLIENT_KEY": str(certs.client_key)}
        r = run([*cluster_args(tls_etcd.url, name), "-p", "single_flight", other, "--", "echo", "must not run"], env=env)
        assert r.returncode == 0, r.stderr
        assert "noop-locked" in r.stderr and f"pid {a.pid}" in r.stderr
        a.stdin.close()
        assert a.wait(timeout=TIMEOUT) == 0, a.stderr.read()
        r = run([*cluster_args(tls_etcd.url, name), "-p", "single_flight", other, "--", "echo", "ran"], env=env)
        assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    finally:
        if a.poll() is None:
            a.kill()
        a.wait(timeout=TIMEOUT)


def test_a_wrong_ca_is_69_with_the_tls_reason(tls_etcd, certs, tmp_path):
    wrong = certs.other_ca()
    r = run([*cluster_args(tls_etcd.url, fresh_name()), "--etcd-cacert", wrong, "--etcd-cert", certs.client,
             "--etcd-key", certs.client_key, "-w", "1", tmp_path, "--", "echo", "must not run"])
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert r.stdout == ""
    assert "TLS" in r.stderr and "certificate" in r.stderr, r.stderr
    assert "--etcd-cacert" in r.stderr  # the hint


def test_no_client_certificate_when_etcd_asks_for_one_is_69_with_the_tls_reason(tls_etcd, certs, tmp_path):
    r = run([*cluster_args(tls_etcd.url, fresh_name()), "--etcd-cacert", certs.ca, "-w", "1", tmp_path, "--",
             "echo", "must not run"])
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert r.stdout == ""
    assert "TLS" in r.stderr, r.stderr
    assert "--etcd-cert" in r.stderr


def test_plain_http_to_a_tls_port_says_to_use_https(tls_etcd, tmp_path):
    plain = tls_etcd.url.replace("https://", "http://")
    r = run([*cluster_args(plain, fresh_name()), "-w", "1", tmp_path, "--", "echo", "must not run"])
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert "speaks TLS" in r.stderr and "use https://" in r.stderr.lower(), r.stderr


def test_an_etcd_user_with_rbac(rbac_etcd, certs, tmp_path):
    name = fresh_name()
    base = [*cluster_args(rbac_etcd.url, name, "--ttl", "2"), *tls_args(certs, cn=False), "--etcd-user", "loop"]
    env = {"LOOPLOCK_ETCD_PASSWORD": PASSWORD}
    # A hold across several renewals, all with the token; the password does
    # not reach the command.
    holder = start_looplock([*base, "-p", "blocking", tmp_path, "--", "sh", "-c",
                             'echo ready; echo "pw=${LOOPLOCK_ETCD_PASSWORD-unset}"; cat >/dev/null'], env=env)
    try:
        expect_line(holder, "ready")
        assert holder.stdout.readline() == "pw=unset\n"
        pwfile = tmp_path / "pw"
        pwfile.write_text(PASSWORD + "\n")
        pwfile.chmod(0o600)
        r = subprocess.run([LOOPLOCK, "--inspect", "--json", *cluster_args(rbac_etcd.url, name), *tls_args(certs, False),
                            "--etcd-user", "loop", "--etcd-password-file", str(pwfile), str(tmp_path)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        c = json.loads(r.stdout)["cluster"]
        assert c["held"] is True and c["holder"]["pid"] == holder.pid
        holder.stdin.close()
        assert holder.wait(timeout=TIMEOUT) == 0, holder.stderr.read()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=TIMEOUT)
    r = run([*base, "--etcd-password-file", pwfile, tmp_path, "--", "echo", "ok"])
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr


def test_a_wrong_password_or_no_permission_is_69_and_never_shows_the_password(rbac_etcd, certs, tmp_path):
    base = [*cluster_args(rbac_etcd.url, fresh_name()), *tls_args(certs, cn=False), "-w", "1"]
    r = run([*base, "--etcd-user", "loop", tmp_path, "--", "echo", "must not run"],
            env={"LOOPLOCK_ETCD_PASSWORD": "not-" + PASSWORD})
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert "cannot log in as etcd user loop" in r.stderr
    assert PASSWORD not in r.stderr
    r = run([*base, "--etcd-user", "nobody", tmp_path, "--", "echo", "must not run"],
            env={"LOOPLOCK_ETCD_PASSWORD": "nobodypw"})
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert "permission denied" in r.stderr and "looplock/" in r.stderr
    assert "nobodypw" not in r.stderr
    # Without a user, etcd refuses too.
    r = run([*base, tmp_path, "--", "echo", "must not run"])
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert r.stdout == ""
    # A client certificate with a CommonName: etcd's gateway refuses it; the hint says what to do.
    r = run([*cluster_args(rbac_etcd.url, fresh_name()), *tls_args(certs), "-w", "1", "--etcd-user", "loop", tmp_path,
             "--", "echo", "must not run"], env={"LOOPLOCK_ETCD_PASSWORD": PASSWORD})
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert "CommonName" in r.stderr and "without one" in r.stderr


def test_a_password_file_is_read_safely(rbac_etcd, certs, tmp_path):
    base = [*cluster_args(rbac_etcd.url, fresh_name()), *tls_args(certs, cn=False), "--etcd-user", "loop"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = run([*base, "--etcd-password-file", fifo, tmp_path, "--", "true"])  # would hang if opened blindly
    assert r.returncode == 64 and "not a regular file" in r.stderr, r.stderr
    r = run([*base, "--etcd-password-file", tmp_path / "missing", tmp_path, "--", "true"])
    assert r.returncode == 64 and "cannot read --etcd-password-file" in r.stderr
    readable = tmp_path / "pw"
    readable.write_text(PASSWORD)
    readable.chmod(0o644)
    r = run([*base, "--etcd-password-file", readable, tmp_path, "--", "echo", "ok"])
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    assert "readable by every user" in r.stderr
    assert PASSWORD not in r.stderr
    r = run([*base, "--etcd-password", PASSWORD, tmp_path, "--", "true"])
    assert r.returncode == 64 and "visible to every user" in r.stderr
    assert PASSWORD not in r.stderr
