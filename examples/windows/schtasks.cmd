@rem A Task Scheduler task that ticks the nightly loop every 5 minutes under
@rem the loop's lock, once per 4-minute slot (a second scheduler firing the
@rem same tick skips it, silently with -q), ended at --max-time 3m (exit 124,
@rem a max_time_exceeded row in D:\loops\nightly\.state.lock.incidents.jsonl).
@rem Run once, as the user the task runs as, from an elevated prompt for
@rem another user. Task Scheduler ends a task by killing looplock.exe, which
@rem ends its whole job and frees the lock.
schtasks /Create /F /TN "looplock\nightly-tick" /SC MINUTE /MO 5 /TR "C:\Tools\looplock\looplock.exe -q --once-per 4m --max-time 3m --operation tick D:\loops\nightly -- py -3 D:\loops\scripts\status.py --tick"
