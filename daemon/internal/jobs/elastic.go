package jobs

import (
	"cmp"
	"slices"

	"github.com/fusiond/fusiond/daemon/api"
)

// Live is every job that has not finished (pending, placed, starting,
// running), in ID order: what the elastic controller counts as a group's
// replicas.
func (m *Manager) Live() []api.Job {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []api.Job
	for _, j := range m.jobs {
		if !j.State.Terminal() {
			out = append(out, cloneJob(j))
		}
	}
	slices.SortFunc(out, func(a, b api.Job) int { return cmp.Compare(idNum(a.ID), idNum(b.ID)) })
	return out
}

// PublishScale publishes an elastic job's replica change on the event
// stream (fusionctl events).
func (m *Manager) PublishScale(ev api.Event) {
	ev.Kind, ev.From, ev.To = api.EventScale, "", ""
	m.events.publish(ev)
}

// PublishReclaim publishes a reclaimed-capacity action (a best-effort
// throttle or eviction) on the event stream.
func (m *Manager) PublishReclaim(ev api.Event) {
	ev.Kind, ev.From, ev.To = api.EventReclaim, "", ""
	m.events.publish(ev)
}

// PublishResize publishes a burstable job's CPU limit change.
func (m *Manager) PublishResize(ev api.Event) {
	ev.Kind, ev.From, ev.To = api.EventResize, "", ""
	m.events.publish(ev)
}
