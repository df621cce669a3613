"""The gate: the program pandaweb writes into a PandaStack guest, as source (no Django imports).

It starts Chromium with its DevTools port on the guest's loopback and listens on the gate port,
which the platform's authenticated port proxy reaches: every request must carry the sandbox's
secret (``X-Pandaweb-Gate``), or it gets a 403. It also takes the worker's egress tunnels and
hands each browser connection to one of them, and kills Chromium at the run's deadline. The
worker's side of these is ``sessions.engine.sandbox.pandastack_link``; the backend that writes
and starts it is ``sessions.engine.sandbox.pandastack``.
"""

from __future__ import annotations

__all__ = ["GATE_SOURCE"]

# The program that runs inside the guest. Standard library only, and Python 3.8-compatible:
# nothing is known about the template's Python beyond ``python3``.

GATE_SOURCE = r'''
"""pandaweb gate (written by the pandaweb worker; see sessions/engine/sandbox/pandastack.py)."""
import base64, hashlib, hmac, json, os, queue, shutil, signal, socket, subprocess, sys
import threading, time

CFG = json.load(open(sys.argv[1]))
DIR = CFG["dir"]
SECRET = CFG["secret"].encode()
TUNNEL = CFG["tunnel_path"].encode()
IDLE = queue.Queue()
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def log(*parts):
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def read_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk or len(data) > 65536:
            return None, b""
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def header_map(head):
    found = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        found[name.strip().lower()] = value.strip()
    return found


def read_response(sock):
    """One response from Chromium's DevTools server, which always sends Content-Length."""
    head, body = read_head(sock)
    if head is None:
        return None, b""
    length = int(header_map(head).get(b"content-length", b"0") or 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


def closing(head, body):
    hop = (b"connection:", b"keep-alive:")
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(hop)]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n" + body


def refuse(conn, status):
    try:
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    finally:
        conn.close()


def pipe(a, b):
    def copy(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()
    a.close()
    b.close()


def devtools_port():
    try:
        with open(os.path.join(CFG["profile"], "DevToolsActivePort")) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def answers(port):
    if not port:
        return False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_pid(name):
    try:
        with open(os.path.join(DIR, name)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 0


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def stop_previous_gate():
    # A restored snapshot may hold an older gate (with another sandbox's secret): end it first.
    pid = read_pid("gate.pid")
    if pid and pid != os.getpid() and b"gate.py" in cmdline(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        for _ in range(50):
            if not pid_alive(pid):
                break
            time.sleep(0.1)
    with open(os.path.join(DIR, "gate.pid"), "w") as f:
        f.write(str(os.getpid()))


def start_or_adopt():
    pid = read_pid("chromium.pid")
    if pid and pid_alive(pid) and answers(devtools_port()):
        log("adopting the running Chromium", pid)
        return pid, None
    if CFG.get("adopt"):
        # A restored snapshot whose browser is gone: a fresh one would silently lack what the
        # snapshot was taken for (a logged-in session).
        log("the restored snapshot has no running Chromium to adopt")
        sys.exit(4)
    chromium = None
    for name in CFG["chromium"]:
        chromium = shutil.which(name)
        if chromium:
            break
    if not chromium:
        log("no Chromium in this guest (looked for %s)" % ", ".join(CFG["chromium"]))
        sys.exit(3)
    home = os.path.join(DIR, "home")
    os.makedirs(home, exist_ok=True)
    try:
        os.unlink(os.path.join(CFG["profile"], "DevToolsActivePort"))
    except OSError:
        pass
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=home, XDG_CONFIG_HOME=home + "/.config", XDG_CACHE_HOME=home + "/.cache")
    with open(os.path.join(DIR, "chromium.log"), "ab") as out:
        proc = subprocess.Popen([chromium] + CFG["args"], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=DIR, start_new_session=True)
    with open(os.path.join(DIR, "chromium.pid"), "w") as f:
        f.write(str(proc.pid))
    log("started", chromium, "as", proc.pid)
    return proc.pid, proc


def stop(pid, why):
    log("stopping:", why)
    needle = DIR.encode()
    # Three rounds: a process forked while the group was being killed escapes the first.
    for _ in range(3):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        # Chromium's crash handler leaves the process group; it names the profile directory.
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid() and needle in cmdline(int(entry)):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(0.2)
    os._exit(0)


def watch(pid, proc):
    path = os.path.join(DIR, "deadline")
    deadline = time.monotonic() + 60  # until the first reading
    seen = None
    while True:
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            stop(pid, "the deadline file is gone")
        except OSError:
            text = seen
        if text != seen:
            try:
                deadline = time.monotonic() + float(json.loads(text)["remaining"])
                seen = text
            except (ValueError, KeyError, TypeError):
                pass  # being rewritten: keep the last deadline
        if time.monotonic() >= deadline:
            stop(pid, "the deadline passed")
        if (proc.poll() is not None) if proc else not pid_alive(pid):
            stop(pid, "Chromium exited")
        time.sleep(0.25)


def on_gate(conn):
    conn.settimeout(30)
    head, rest = read_head(conn)
    if head is None:
        conn.close()
        return
    headers = header_map(head)
    if not hmac.compare_digest(headers.get(b"x-pandaweb-gate", b""), SECRET):
        refuse(conn, b"403 Forbidden")
        return
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    target = parts[1] if len(parts) == 3 else b""
    upgrade = headers.get(b"upgrade", b"").lower() == b"websocket"
    if target == TUNNEL:
        if not upgrade:
            refuse(conn, b"400 Bad Request")
            return
        key = headers.get(b"sec-websocket-key", b"")
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        conn.settimeout(None)
        IDLE.put(conn)
        return
    # Everything else is for Chromium's DevTools server. One request per connection: the
    # platform's proxy reuses connections, and only the first request on one was checked.
    try:
        upstream = socket.create_connection(("127.0.0.1", devtools_port()), timeout=10)
    except OSError:
        refuse(conn, b"502 Bad Gateway")
        return
    lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"x-pandaweb-gate:")]
    if not upgrade:
        lines = [l for l in lines if not l.lower().startswith((b"connection:", b"keep-alive:"))]
        lines.append(b"Connection: close")
    upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + (rest if upgrade else b""))
    if upgrade:
        reply, after = read_head(upstream)
        if reply is not None and reply.split(b" ")[1:2] == [b"101"]:
            conn.settimeout(None)
            upstream.settimeout(None)
            conn.sendall(reply + b"\r\n\r\n" + after)
            pipe(conn, upstream)
            return
        body = after
    else:
        reply, body = read_response(upstream)
    upstream.close()
    if reply is None:
        refuse(conn, b"502 Bad Gateway")
        return
    conn.sendall(closing(reply, body))
    conn.close()


def on_proxy(conn):
    give_up = time.monotonic() + 30
    while True:
        left = give_up - time.monotonic()
        if left <= 0:
            log("no egress tunnel from the worker within 30 s; a browser connection is refused")
            conn.close()
            return
        try:
            tunnel = IDLE.get(timeout=left)
        except queue.Empty:
            continue
        try:
            tunnel.settimeout(10)
            tunnel.sendall(b"\x01")
            taken = tunnel.recv(1)
            tunnel.settimeout(None)
        except OSError:
            taken = b""
        if taken == b"\x02":
            pipe(conn, tunnel)
            return
        tunnel.close()


def keepalive():
    while True:
        time.sleep(20)
        held = []
        while True:
            try:
                held.append(IDLE.get_nowait())
            except queue.Empty:
                break
        for tunnel in held:
            try:
                tunnel.sendall(b"\x00")
                IDLE.put(tunnel)
            except OSError:
                tunnel.close()


def listen(host, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def serve(sock, handler):
    def guarded(conn):
        try:
            handler(conn)
        except Exception as exc:
            log(handler.__name__, "failed:", repr(exc))
            conn.close()
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=guarded, args=(conn,), daemon=True).start()


def main():
    stop_previous_gate()
    proxy = listen("127.0.0.1", CFG["proxy_port"])
    gate = listen(CFG["gate_host"], CFG["gate_port"])
    pid, proc = start_or_adopt()
    threading.Thread(target=serve, args=(proxy, on_proxy), daemon=True).start()
    threading.Thread(target=serve, args=(gate, on_gate), daemon=True).start()
    threading.Thread(target=keepalive, daemon=True).start()
    log("gate on %s:%d," % (CFG["gate_host"], CFG["gate_port"]),
        "proxy on 127.0.0.1:%d" % CFG["proxy_port"])
    watch(pid, proc)


main()
'''
