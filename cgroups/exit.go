package cgroups

import "syscall"

// Exit reasons reported for a job's main process.
const (
	ExitExited    = "exited"
	ExitSignaled  = "signaled"
	ExitOOMKilled = "oom-killed"
)

// ExitReason classifies how a job's process ended: a SIGKILL while the
// cgroup's OOM-kill counter rose above oomKillsBefore (read when the job
// started, normally zero) is an OOM kill.
func ExitReason(ws syscall.WaitStatus, oomKillsBefore uint64, after Stats) string {
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL && after.OOMKills > oomKillsBefore:
		return ExitOOMKilled
	case ws.Signaled():
		return ExitSignaled
	}
	return ExitExited
}
