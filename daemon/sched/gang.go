package sched

import (
	"errors"
	"fmt"
	"slices"
)

// PlaceGang places every member of a gang or none. Members are placed one
// after the other, each seeing the previous ones applied; on any failure
// everything applied so far is released again and the error returned, so
// a gang never holds a partial allocation.
func (e *Engine) PlaceGang(reqs []Request, nodes []*Node) ([]Assignment, error) {
	out := make([]Assignment, 0, len(reqs))
	rollback := func() {
		for i := len(out) - 1; i >= 0; i-- {
			e.Release(&reqs[i], &out[i], nodes)
		}
	}
	for i := range reqs {
		d, err := e.Place(&reqs[i], nodes)
		if err == nil {
			err = e.Commit(&reqs[i], &d.Assignment, nodes)
		}
		if err != nil {
			rollback()
			return nil, fmt.Errorf("gang member %d (%s): %w", i, reqs[i].ID, err)
		}
		out = append(out, d.Assignment)
	}
	return out, nil
}

// Reservations holds whole-gang reservations until they are committed or
// their logical deadline passes. A gang is reserved in one step (all
// members or none), so reservations can never deadlock each other.
type Reservations struct {
	live map[string]*reservation
}

type reservation struct {
	reqs     []Request
	assigned []Assignment
	deadline int64
}

// Reserve places the whole gang now and holds it until now+ttl.
func (r *Reservations) Reserve(id string, reqs []Request, now, ttl int64, e *Engine, nodes []*Node) error {
	if e == nil {
		return fmt.Errorf("%w: no engine", ErrInvalidRequest)
	}
	if r.live == nil {
		r.live = map[string]*reservation{}
	}
	if _, ok := r.live[id]; ok {
		return fmt.Errorf("%w: %s already reserved", ErrInvalidRequest, id)
	}
	a, err := e.PlaceGang(reqs, nodes)
	if err != nil {
		return err
	}
	r.live[id] = &reservation{reqs: slices.Clone(reqs), assigned: a, deadline: now + ttl}
	return nil
}

// Commit turns a reservation into a placement. It fails with
// ErrReservationExpired (after releasing it) when now is past the deadline.
func (r *Reservations) Commit(id string, now int64, e *Engine, nodes []*Node) ([]Assignment, error) {
	res, ok := r.live[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownReservation, id)
	}
	delete(r.live, id)
	if now > res.deadline {
		res.release(e, nodes)
		return nil, fmt.Errorf("%w: %s (deadline %d, now %d)", ErrReservationExpired, id, res.deadline, now)
	}
	return res.assigned, nil
}

// Cancel releases a reservation.
func (r *Reservations) Cancel(id string, e *Engine, nodes []*Node) error {
	res, ok := r.live[id]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownReservation, id)
	}
	delete(r.live, id)
	res.release(e, nodes)
	return nil
}

// Expire releases every reservation whose deadline is before now and
// returns their IDs, sorted.
func (r *Reservations) Expire(now int64, e *Engine, nodes []*Node) []string {
	var ids []string
	for id, res := range r.live {
		if now > res.deadline {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		r.live[id].release(e, nodes)
		delete(r.live, id)
	}
	return ids
}

func (res *reservation) release(e *Engine, nodes []*Node) {
	for i := len(res.assigned) - 1; i >= 0; i-- {
		e.Release(&res.reqs[i], &res.assigned[i], nodes)
	}
}

// ErrNoPreemption means no set of lower-tier victims within the budget
// frees enough room.
var ErrNoPreemption = errors.New("sched: no preemption within budget frees room")
