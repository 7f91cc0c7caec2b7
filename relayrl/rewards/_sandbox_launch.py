"""The sandbox's own side: run as `python -I -S _sandbox_launch.py JOB_FD MARKER` by `sandbox.py`.

Standard library only, and never imported by relayrl: it runs in the child process the parent started
with `start_new_session=True`, so the parent can kill it and everything below it with one `killpg`.

With namespaces (the default where the kernel allows them) the chain is:
  launcher (caller's uid)  --unshare(mount, pid, net [, user])-->  fork
  init     (pid 1 of the new pid namespace; trusted, stays in the parent's process group)
           builds the program's root in a tmpfs and pivots into it (`build_view`), then  -->  fork
  program  rlimits, the lowest CPU priority (SCHED_IDLE), an unprivileged uid of its own when we are root,
           `exec` of the harness (drops caps)
When init dies (the program returned, or the parent's killpg reached it) the kernel kills every process
left in the pid namespace, so a double-forked daemon or a `setsid` child cannot outlive the run, and the
mount namespace's tmpfs files vanish with it.

The program's root (a 1 MB tmpfs, read-only once built) holds only:
  /python          the interpreter's prefix (sys.base_prefix), read-only; its site-packages covered by an
                   empty read-only tmpfs (the program gets the standard library, no installed package)
  library dirs     the directories of the shared libraries the interpreter and its extension modules link
                   (found with ldd by sandbox.py), read-only, at their host paths, with the symlinks on the
                   way recreated (/lib -> usr/lib, /lib64 -> usr/lib64)
  /dev             null, zero, random, urandom (binds of the host's nodes), fd/stdin/stdout/stderr links
  /proc            a proc of the new pid namespace (only the sandbox's processes)
  /tmp /var/tmp /dev/shm   fresh tmpfs of `disk_mb` each; /tmp/work is the cwd and HOME
The host's tree is detached after pivot_root, so nothing else (/work, /root, /home, /etc, the source tree,
datasets, checkpoints, the venv) exists in the namespace. /proc/self/mountinfo still names the host paths
the binds came from: names, not contents.

Without namespaces (`namespaces: false`) the program is exec'd directly with the same rlimits and a
Python audit hook that refuses socket creation; see sandbox.py for what that mode does not contain.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_NOATIME, MS_NODIRATIME = 1, 2, 4, 8, 1024, 2048
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 32, 4096, 16384, 1 << 18, 1 << 21
ST_RELATIME = 4096  # statvfs's bit for relatime (the mount flag is MS_RELATIME)
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # no glibc wrapper
STAGE = "/tmp"  # where the program's root is assembled: the host's /tmp, hidden by the tmpfs mounted on it
PYTHON_DIR = "/python"  # where the interpreter's prefix appears (its host path may be under /root or /home)
OLD_ROOT = "/.host"  # the host's root after pivot_root, until it is detached
DEVICES = ("null", "zero", "random", "urandom")
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
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {source or fstype} on {target}")


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
    except Exception as err:  # noqa: BLE001 - the sandbox could not be set up: say so, with a code of our own
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
        except BaseException as err:  # noqa: BLE001 - init must exit with our code whatever happened
            print(f"sandbox setup failed: {err}", file=sys.stderr)
            os._exit(EXIT_SETUP_FAILED)
    os._exit(_exit_code(os.waitpid(init, 0)[1]))


def run_init(job: dict, marker: str) -> None:
    """pid 1 of the new pid namespace: build the filesystem view, run the program, exit with its status."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        build_view(job["view"], job["disk_mb"])
    except OSError as err:
        raise OSError(err.errno, f"could not build the program's filesystem view: {err.strerror}") from None
    os.makedirs(WORK_DIR)
    with open(f"{WORK_DIR}/main.py", "w", encoding="utf-8") as f:
        f.write(job["program"])
    if job["uid"] is not None:
        os.chown(WORK_DIR, job["uid"], job["uid"])
    program = os.fork()
    if program == 0:
        run_program(job, marker, weak=False)
    os._exit(_exit_code(os.waitpid(program, 0)[1]))


def build_view(view: dict, disk_mb: int) -> None:
    """Assemble the program's root in a tmpfs, pivot into it and detach the host's tree (see the docstring)."""
    root = STAGE
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.makedirs(root + PYTHON_DIR)
    bind_read_only(view["prefix"], root + PYTHON_DIR)
    for relative in view["hidden"]:  # installed packages: the program gets the standard library only
        mount("tmpfs", f"{root}{PYTHON_DIR}/{relative}", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=555")
    bound: set[str] = set()
    for directory in view["library_dirs"]:
        real = _mirror_links(root, directory)
        if real not in bound:
            os.makedirs(root + real, exist_ok=True)
            bind_read_only(real, root + real)
            bound.add(real)
    _add_devices(root)
    for path in SCRATCH_DIRS:
        os.makedirs(root + path)
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,mode=1777")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)  # only this namespace's processes
    os.makedirs(root + OLD_ROOT)
    pivot_root(root, root + OLD_ROOT)
    os.chdir("/")
    _check(libc.umount2(OLD_ROOT.encode(), MNT_DETACH), f"umount {OLD_ROOT}")  # the host's tree leaves the namespace
    os.rmdir(OLD_ROOT)
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _add_devices(root: str) -> None:
    os.makedirs(root + "/dev")
    for name in DEVICES:  # binds of the host's nodes: they work whatever the tmpfs's nodev says
        open(f"{root}/dev/{name}", "w").close()
        mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")


def bind_read_only(source: str, target: str) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    # A remount must repeat the flags the source mount has (in a user namespace they are locked), else EPERM.
    kept = os.statvfs(source).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    relatime = MS_RELATIME if os.statvfs(source).f_flag & ST_RELATIME else 0
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept | relatime)


def pivot_root(new_root: str, put_old: str) -> None:
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: no syscall number known for machine {os.uname().machine!r}")
    _check(libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


def _mirror_links(root: str, path: str) -> str:
    """Recreate under `root` the symlinks met on the way to host `path` (/lib -> usr/lib); return its real path."""
    real = "/"
    for part in path.strip("/").split("/"):
        step = os.path.join(real, part)
        if not os.path.islink(step):
            real = step
            continue
        target = os.readlink(step)
        os.makedirs(root + real, exist_ok=True)  # `real` has no symlink in it, so this stays inside `root`
        if not os.path.lexists(root + step):
            os.symlink(target, root + step)
        real = _mirror_links(root, os.path.normpath(os.path.join(real, target)))
    return real


def run_program(job: dict, marker: str, weak: bool) -> None:
    os.chdir(WORK_DIR if not weak else job["work_dir"])
    limits = {
        resource.RLIMIT_CPU: job["cpu_s"],
        resource.RLIMIT_AS: job["memory_mb"] << 20,
        resource.RLIMIT_FSIZE: job["file_mb"] << 20,
        resource.RLIMIT_NOFILE: job["open_files"],
        resource.RLIMIT_NPROC: job["processes"],
        resource.RLIMIT_CORE: 0,
    }
    for kind, value in limits.items():
        resource.setrlimit(kind, (value, value))
    lowest_priority()
    if job["uid"] is not None and not weak:  # root: an uid of its own, which owns nothing but the work dir
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
    python, env = job["python"], job["env"]
    if not weak:  # the view's interpreter; its RUNPATH (libpython) and the loader's cache name host paths
        python = f"{PYTHON_DIR}/{job['view']['python']}"
        env = {
            **env,
            "PATH": f"{PYTHON_DIR}/bin",
            "LD_LIBRARY_PATH": ":".join(
                [*(f"{PYTHON_DIR}/{d}" for d in job["view"]["prefix_library_dirs"]), *job["view"]["library_dirs"]]
            ),
        }
    os.execve(python, [python, "-I", "-S", "-B", "-c", HARNESS, marker, job["call"] or "", "1" if weak else "0"], env)


def lowest_priority() -> None:
    """The program runs only when the machine has nothing else to do: a spinning program or a fork bomb cannot
    starve the supervisor that must kill it at its deadline. RLIMIT_NICE 0 (and no capabilities after exec) keep
    it from climbing back."""
    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    os.nice(19)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    main()
