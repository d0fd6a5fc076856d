package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fusiond/fusiond/daemon/api"
	"github.com/fusiond/fusiond/daemon/internal/admission"
	"github.com/fusiond/fusiond/devices"
)

// A pod's device hold is a job record (Spec.Pod set) for the devices
// kubelet allocated to one container of a pod through fusiond's device
// plugin. It enters like every job (Admit, source admission.Kubelet: the
// same validation, limits and audit), but it is never queued: its devices
// are the ones kubelet chose, held at once (PodPlacer.HoldPod) or refused.
// It runs no process: it moves pending → placed → starting (its devices
// prepared: a MIG instance created on demand) → running, and stays
// running, holding its devices in the one ledger, until kubelet frees
// them (ReleasePod). A daemon restart re-reserves it (Recover).

// PodPlacer is a Placer that holds exactly the devices kubelet allocated
// to a pod's container (the daemon's placer is one).
type PodPlacer interface {
	// PodSpec is what a hold of h's devices amounts to, as a spec's
	// resources (GPUs, a MIG profile, a share, an FPGA bitstream), or an
	// *api.Error naming an unknown resource or device ID.
	PodSpec(h api.PodHold) (api.Resources, error)
	// HoldPod reserves the devices j.Spec.Pod names as j's allocation, or
	// says why it cannot (a device held, out of service or unknown).
	HoldPod(j *api.Job) (api.Allocation, error)
}

// LimitPodHolds names the limit on pods' device holds.
const LimitPodHolds = "kubernetes.max_holds"

// kubelet is who a pod's device hold is admitted for: kubelet runs as
// root (its records go to the admins' audit file, never rate-limited),
// and a hold runs nothing as anyone.
func kubelet() api.Caller { return api.Caller{UID: 0, GID: 0, User: "root", Admin: true} }

// PodEntry is what Admit needs besides the spec for kubelet's
// allocation (Entry.Pod), and where it leaves the devices' grant.
type PodEntry struct {
	// Explain, recorded as the hold's placement, says how kubelet's
	// devices were chosen.
	Explain string
	// Grant is what the pod's container must be granted, set when the
	// hold is admitted.
	Grant devices.Grant
}

// AdmitPod admits a hold of the devices kubelet allocated to a pod's
// container (h: the plugin's resource and device IDs) and prepares them;
// explain, recorded as the hold's placement, says how the devices were
// chosen. It returns the hold's record and what the container must be
// granted. Refused, nothing is held; the audit log records either
// outcome.
//
// Kubelet allocates only devices it has freed: a hold of the same
// resource naming one of h's devices was for a container that has ended
// (its release may still be waiting for the reconcile loop's grace), so
// it is released first.
func (m *Manager) AdmitPod(ctx context.Context, h api.PodHold, explain string) (api.Job, devices.Grant, error) {
	pp, ok := m.placer.(PodPlacer)
	if !ok {
		return api.Job{}, devices.Grant{}, &admission.Refusal{Rule: "kubernetes.device_plugin", Why: "this host's placer holds no pods' devices"}
	}
	for _, old := range m.PodHolds() {
		if old.Spec.Pod.Resource != h.Resource || !slices.ContainsFunc(old.Spec.Pod.Devices, func(id string) bool { return slices.Contains(h.Devices, id) }) {
			continue
		}
		why := "kubelet allocated its devices to another container, so the one it held them for has ended"
		if err := m.ReleasePod(old.ID, why); err != nil && !errors.As(err, new(*api.Error)) {
			return api.Job{}, devices.Grant{}, api.Errorf(api.CodeInternal, "releasing hold %s, whose devices kubelet allocated again: %v", old.ID, err)
		}
	}
	res, err := pp.PodSpec(h)
	if err != nil {
		return api.Job{}, devices.Grant{}, err
	}
	spec := api.JobSpec{Name: podHoldName(h.Resource), Class: api.ClassService, Tier: api.TierGuaranteed,
		Resources: res, Pod: &api.PodHold{Resource: h.Resource, Devices: slices.Clone(h.Devices)}}
	pe := &PodEntry{Explain: explain}
	js, err := m.Admit(ctx, Entry{Source: admission.Kubelet, Caller: kubelet(), Pod: pe, Specs: []api.JobSpec{spec}})
	if err != nil {
		return api.Job{}, devices.Grant{}, err
	}
	return js[0], pe.Grant, nil
}

// podHoldName is a hold's job name: "pod-" and the resource's own name
// ("fusiond.io/gpu-h200": pod-gpu-h200).
func podHoldName(resource string) string {
	_, name, _ := strings.Cut(resource, "/")
	name = "pod-" + cmp.Or(name, resource)
	if len(name) > api.MaxNameLen {
		name = name[:api.MaxNameLen]
	}
	return strings.TrimRight(name, "._-")
}

// holdPod is a pod hold's queue step: its devices held in the placer,
// prepared, and the record moved to running; the grant is left in pe.
// Refused or failed, the record ends failed with why, and nothing stays
// held.
func (m *Manager) holdPod(j api.Job, pe *PodEntry) ([]api.Job, error) {
	m.mu.Lock()
	live := m.jobs[j.ID]
	m.mu.Unlock()
	fail := func(why string, err error) ([]api.Job, error) {
		if terr := m.transition(live, api.StateFailed, why, func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		}); terr != nil {
			m.log.Warn("recording a refused pod hold", "job", j.ID, "err", terr)
		}
		return nil, err
	}
	pp := m.placer.(PodPlacer) // AdmitPod checked
	snap := j
	alloc, err := pp.HoldPod(&snap)
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) {
			ae = &api.Error{Code: api.CodeConflict, Field: "pod.devices", Message: err.Error()}
		}
		return fail("kubelet's devices could not be held: "+err.Error(), ae)
	}
	alloc.Explain = cmp.Or(pe.Explain, alloc.Explain)
	summary, _, _ := strings.Cut(cmp.Or(alloc.Explain, "devices kubelet chose"), "\n")
	if err := m.move(live, api.StatePending, api.StatePlaced, "placed: "+summary, func(j *api.Job) {
		j.Allocation = &alloc
	}, false); err != nil {
		m.placer.Release(&snap)
		return fail("holding kubelet's devices: "+err.Error(), err)
	}
	if err := m.move(live, api.StatePlaced, api.StateStarting, "preparing kubelet's devices", func(j *api.Job) { j.Attempt = 1 }, false); err != nil {
		m.placer.Release(&snap)
		return fail("holding kubelet's devices: "+err.Error(), err)
	}
	m.mu.Lock()
	snap = cloneJob(live)
	m.mu.Unlock()
	if prep := m.cfg.Preparer; prep != nil {
		g, err := prep.Prepare(context.Background(), &snap)
		if err != nil {
			m.placer.Release(&snap)
			return fail("could not prepare kubelet's devices: "+err.Error(), api.Errorf(api.CodeInternal, "preparing the devices: %v", err))
		}
		pe.Grant = g
	}
	now := m.now()
	if err := m.transitionFrom(live, api.StateStarting, api.StateRunning, fmt.Sprintf("holding %s for a kubelet pod", strings.Join(snap.Allocation.Devices, ", ")), func(j *api.Job) {
		j.Allocation = cloneAllocation(snap.Allocation) // with the instance Prepare made
		j.StartedAt = &now
	}); err != nil {
		m.release(&snap)
		return fail("recording the hold: "+err.Error(), api.Errorf(api.CodeInternal, "recording the hold: %v", err))
	}
	m.mu.Lock()
	out := cloneJob(live)
	m.mu.Unlock()
	return []api.Job{out}, nil
}

// PodHolds lists the pods' device holds that hold their devices now,
// oldest first.
func (m *Manager) PodHolds() []api.Job {
	m.mu.Lock()
	var out []api.Job
	for _, j := range m.jobs {
		if j.Spec.Pod != nil && j.State == api.StateRunning {
			out = append(out, cloneJob(j))
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b api.Job) int { return cmp.Compare(idNum(a.ID), idNum(b.ID)) })
	return out
}

// podHold is the running pod hold id, or an error.
func (m *Manager) podHold(id string) (*api.Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := m.jobs[id]
	if j == nil || j.Spec.Pod == nil {
		return nil, api.Errorf(api.CodeNotFound, "no pod hold %s", id)
	}
	if j.State != api.StateRunning {
		return nil, api.Errorf(api.CodeConflict, "pod hold %s is %s", id, j.State)
	}
	return j, nil
}

// BindPod records the pod container a hold belongs to (from kubelet's
// pod resources); binding it to the pod it names already changes nothing.
func (m *Manager) BindPod(id string, pod api.PodRef) error {
	j, err := m.podHold(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	same := j.Pod != nil && *j.Pod == pod
	m.mu.Unlock()
	if same {
		return nil
	}
	return m.annotate(j, fmt.Sprintf("held for pod %s/%s container %s", pod.Namespace, pod.Name, pod.Container), func(j *api.Job) {
		p := pod
		j.Pod = &p
	})
}

// ReleasePod ends a pod's device hold (kubelet no longer has its
// devices): recorded as succeeded, then its devices are given back. Until
// the end is stored the devices stay held (the reconcile loop asks again).
func (m *Manager) ReleasePod(id, why string) error {
	j, err := m.podHold(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	held := cloneJob(j)
	m.mu.Unlock()
	err = m.transitionFrom(j, api.StateRunning, api.StateSucceeded, "released: "+why, func(j *api.Job) {
		t := m.now()
		j.FinishedAt = &t
	})
	if errors.Is(err, ErrBadTransition) {
		return api.Errorf(api.CodeConflict, "pod hold %s ended meanwhile", id)
	}
	if err != nil {
		return err
	}
	m.release(&held)
	m.mu.Lock()
	delete(m.unreserved, id)
	m.mu.Unlock()
	m.poke()
	return nil
}

// recoverPod takes up a pod's device hold an earlier daemon left: one
// still running holds its devices again; one the daemon stopped in the
// middle of admitting (kubelet's Allocate got no answer, so its pod was
// not admitted) ends failed, its devices given back.
func (m *Manager) recoverPod(j *api.Job) error {
	if j.State != api.StateRunning {
		m.release(j)
		return m.transition(j, api.StateFailed, "fusiond restarted before kubelet's allocation was answered", func(j *api.Job) {
			t := m.now()
			j.FinishedAt = &t
		})
	}
	if problem := m.reserveAgain(j); problem != nil {
		// The pod may still use them: nothing is placed until kubelet
		// frees them, as for a re-attached job.
		m.log.Error("a pod's device hold could not be reserved again; placing nothing until kubelet frees it", "job", j.ID, "err", problem)
		m.unreserved[j.ID] = problem.Error()
	}
	return nil
}
