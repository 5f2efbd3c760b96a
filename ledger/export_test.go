package ledger

// SetAfterStep installs the report-path fault-injection hook (tests only).
func (l *Ledger) SetAfterStep(f func(Step) error) { l.afterStep = f }
