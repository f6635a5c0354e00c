package benchkit

import "sync"

// SyncMap is the adapter over sync.Map.
type SyncMap[K comparable] struct{ m sync.Map }

// Lookup returns the value of k.
func (m *SyncMap[K]) Lookup(k K) (*Val, bool) {
	v, ok := m.m.Load(k)
	if !ok {
		return nil, false
	}
	return v.(*Val), true
}

// Delete removes k and returns its value.
func (m *SyncMap[K]) Delete(k K) (*Val, bool) {
	v, ok := m.m.LoadAndDelete(k)
	if !ok {
		return nil, false
	}
	return v.(*Val), true
}

// Insert stores v as the value of k.
func (m *SyncMap[K]) Insert(k K, v *Val) { m.m.Store(k, v) }
