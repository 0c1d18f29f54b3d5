"""A tick that stops at a safe point when looplock warns it.

    looplock --max-time 4m --warn-before 30s --once-per 4m --operation tick \\
        /srv/loops/nightly -- python3 warned_tick.py /srv/loops/nightly

--max-time ends a job with TERM, then KILL: a tick killed halfway through
its work loses it. With --warn-before, looplock first sends the job USR1
(--warn-signal), 30 s before that TERM (and, with --etcd, when the lease's
renewals fail), and LOOPLOCK_DEADLINE says when the TERM comes. This tick
works through its items one at a time; on the warning, or when the deadline
is near, it finishes the current item, writes its checkpoint (the next item
to do) to LOOP_DIR/tick.checkpoint and exits 0, so the run ends cleanly and
counts as this slot's run; the next tick starts from the checkpoint.

looplock sends the warning only to the job's processes that catch it (a
shell around the tick, -c 'python3 warned_tick.py DIR; echo done', is not
ended by it), and, until the TERM, to any that installs its handler later:
install it early, as here, so that the warning is not missed.

    warned_tick.py LOOP_DIR [ITEMS [SECONDS_PER_ITEM]]

(ITEMS and SECONDS_PER_ITEM, default 100 and 0.05, stand in for real work.)
"""
import os
import signal
import sys
import time

warned = False


def on_warning(signum, frame):
    global warned
    warned = True


signal.signal(signal.SIGUSR1, on_warning)

loop_dir = sys.argv[1]
items = int(sys.argv[2]) if len(sys.argv) > 2 else 100
per_item = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
checkpoint = os.path.join(loop_dir, "tick.checkpoint")
# When looplock sends TERM (Unix time; absent without --max-time).
deadline = float(os.environ["LOOPLOCK_DEADLINE"]) if "LOOPLOCK_DEADLINE" in os.environ else None

start = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as f:
        start = int(f.read() or 0)
    print(f"resuming at item {start}", flush=True)


def save(next_item):
    tmp = checkpoint + ".new"
    with open(tmp, "w") as f:
        f.write(str(next_item))
    os.replace(tmp, checkpoint)  # whole or not at all


for item in range(start, items):
    time.sleep(per_item)  # the item's work
    near_deadline = deadline is not None and time.time() > deadline - 2 * per_item
    if warned or near_deadline:
        save(item + 1)
        print(f"checkpointed at item {item + 1}", flush=True)
        sys.exit(0)
save(0)
print("done", flush=True)
