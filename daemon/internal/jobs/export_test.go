package jobs

// CollectGarbage runs one retention pass now (the manager runs one a
// minute).
func (m *Manager) CollectGarbage() { m.collectGarbage() }
