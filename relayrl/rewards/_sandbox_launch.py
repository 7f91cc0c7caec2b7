"""The sandbox's own side: run as `python -I -S _sandbox_launch.py JOB_FD MARKER` by `sandbox.py`.

Standard library only, and never imported by relayrl: it runs in the child process the parent started
with `start_new_session=True`, so the parent can kill it and everything below it with one `killpg`.

With namespaces (the default where the kernel allows them) the chain is:
  launcher (caller's uid)  --unshare(mount, pid, net [, user])-->  fork
  init     (pid 1 of the new pid namespace; trusted, stays in the parent's process group)
           private /proc, tmpfs on /tmp /var/tmp /dev/shm, every other mount read-only, the interpreter
           bound back where an untraversable directory (e.g. /root) is hidden  -->  fork
  program  rlimits, an unprivileged uid of its own when we are root, `exec` of the harness (drops caps)
When init dies (the program returned, or the parent's killpg reached it) the kernel kills every process
left in the pid namespace, so a double-forked daemon or a `setsid` child cannot outlive the run, and the
mount namespace's tmpfs files vanish with it.

Without namespaces (`namespaces: false`) the program is exec'd directly with the same rlimits and a
Python audit hook that refuses socket creation; see sandbox.py for what that mode does not contain.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
WORK_DIR = "/tmp/work"
EXIT_SETUP_FAILED = 125  # the sandbox itself could not be set up (not the program's fault)

# The harness the program runs under. `call` tests: run the program as a module (its prints go to stderr),
# evaluate the call and write repr(value) to stdout. `stdin` tests: run it as __main__.
HARNESS = r"""
import sys
call = sys.argv[2]
if sys.argv[3] == "1":  # no namespaces: refuse sockets from Python (an audit hook cannot be removed)
    def _refuse(event, args):
        if event in ("socket.__new__", "socket.connect", "socket.bind"):
            raise PermissionError("network access is disabled in the sandbox")
    sys.addaudithook(_refuse)
source = open("main.py", encoding="utf-8", errors="replace").read()
module = {"__name__": "solution" if call else "__main__", "__file__": "main.py", "__builtins__": __builtins__}
if not call:
    exec(compile(source, "main.py", "exec"), module)
else:
    out, sys.stdout = sys.stdout, sys.stderr
    exec(compile(source, "main.py", "exec"), module)
    value = eval(compile(call, "<test>", "eval"), module)
    sys.stdout = out
    sys.stdout.write(repr(value))
    sys.stdout.flush()
"""

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def main() -> None:
    with os.fdopen(int(sys.argv[1])) as job_file:  # an inherited fd: the job file has no name on disk
        job = json.load(job_file)
    marker = sys.argv[2]
    try:
        die_with_parent()
        if os.getppid() != job["parent_pid"]:  # the parent died before the line above
            os._exit(EXIT_SETUP_FAILED)
        if not job["namespaces"]:
            run_program(job, marker, weak=True)
        launch(job, marker)
    except Exception as err:  # the sandbox could not be set up: say so, with a code of our own
        print(f"sandbox setup failed: {err}", file=sys.stderr)
        os._exit(EXIT_SETUP_FAILED)


def die_with_parent() -> None:
    """SIGKILL us when our parent dies: a reward worker killed mid-run must not leave its sandbox behind."""
    _check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def launch(job: dict, marker: str) -> None:
    as_root = os.geteuid() == 0
    job["uid"] = 2_000_000 + os.getpid() if as_root else None  # our pid makes it unique among live runs
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | (0 if as_root else CLONE_NEWUSER)), "unshare")
    if not as_root:  # map only our own ids; the new namespace's capabilities end at the program's exec
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    init = os.fork()
    if init == 0:
        try:
            die_with_parent()
            run_init(job, marker)
        except BaseException as err:
            print(f"sandbox setup failed: {err}", file=sys.stderr)
            os._exit(EXIT_SETUP_FAILED)
    os._exit(_exit_code(os.waitpid(init, 0)[1]))


def run_init(job: dict, marker: str) -> None:
    """pid 1 of the new pid namespace: build the filesystem view, run the program, exit with its status."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # shows only this namespace's processes
    for path in SCRATCH_DIRS:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={job['disk_mb']}m,mode=1777")
    interpreter = os.path.dirname(os.path.dirname(job["python"]))  # <prefix>/bin/python -> <prefix>
    hidden = _untraversable_ancestor(interpreter) if job["uid"] is not None else None
    if hidden:  # bind the interpreter aside, hide its ancestor behind an empty tmpfs, bind it back
        os.makedirs("/tmp/.interp")
        mount(interpreter, "/tmp/.interp", None, MS_BIND | MS_REC)
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        os.makedirs(interpreter, exist_ok=True)
        mount("/tmp/.interp", interpreter, None, MS_BIND | MS_REC)
        _check(libc.umount2(b"/tmp/.interp", MNT_DETACH), "umount /tmp/.interp")
        os.rmdir("/tmp/.interp")
    for path, flags in _mounts():  # read-only everywhere but the scratch tmpfs (best effort: some refuse)
        if path not in SCRATCH_DIRS and path != "/proc" and not path.startswith("/proc/"):
            libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None)
    os.makedirs(WORK_DIR)
    with open(f"{WORK_DIR}/main.py", "w", encoding="utf-8") as f:
        f.write(job["program"])
    if job["uid"] is not None:
        os.chown(WORK_DIR, job["uid"], job["uid"])
    program = os.fork()
    if program == 0:
        run_program(job, marker, weak=False)
    os._exit(_exit_code(os.waitpid(program, 0)[1]))


def run_program(job: dict, marker: str, weak: bool) -> None:
    os.chdir(WORK_DIR if not weak else job["work_dir"])
    limits = {resource.RLIMIT_CPU: job["cpu_s"], resource.RLIMIT_AS: job["memory_mb"] << 20,
              resource.RLIMIT_FSIZE: job["file_mb"] << 20, resource.RLIMIT_NOFILE: job["open_files"],
              resource.RLIMIT_NPROC: job["processes"], resource.RLIMIT_CORE: 0}
    for kind, value in limits.items():
        resource.setrlimit(kind, (value, value))
    if job["uid"] is not None and not weak:  # root: an uid of its own, which owns nothing but the work dir
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    python = job["python"]
    os.execve(python, [python, "-I", "-S", "-B", "-c", HARNESS, marker, job["call"] or "", "1" if weak else "0"],
              job["env"])


def _untraversable_ancestor(path: str) -> str | None:
    """The top-most directory on `path` that others cannot enter (e.g. /root with mode 700)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        directory = "/" + "/".join(parts[:i])
        if not os.stat(directory).st_mode & 0o001:
            return directory
    return None


def _mounts() -> list[tuple[str, int]]:
    """(mount point, its per-mount flags): a remount must keep nosuid/nodev/noexec/atime flags it inherits."""
    known = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048,
             "relatime": 1 << 21}
    with open("/proc/self/mountinfo") as f:
        fields = [line.split() for line in f]
    return [(row[4].replace("\\040", " "), sum(known.get(opt, 0) for opt in row[5].split(","))) for row in fields]


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    main()
