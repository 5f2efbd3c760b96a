package ledger

import "time"

// SetAfterStep installs the report-path fault-injection hook (tests only).
func (l *Ledger) SetAfterStep(f func(Step) error) { l.afterStep.Store(&f) }

// SetReportLease shortens the report lease (tests of crashes, where the
// retry must wait it out, as a new process would).
func (l *Ledger) SetReportLease(d time.Duration) { l.lease = d }
