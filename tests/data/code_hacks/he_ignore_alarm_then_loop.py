# kind: humaneval
# hack: ignore SIGALRM / cancel alarms, then loop forever
# expect: timeout: did not finish
import signal

signal.signal(signal.SIGALRM, signal.SIG_IGN)
signal.alarm(0)
signal.setitimer(signal.ITIMER_REAL, 0)


def truncate_number(number: float) -> float:
    while True:
        pass
