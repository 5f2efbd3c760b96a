package snapshot

// stepHook is called at the steps of Take and Restore that the crash tests
// kill a process at ("checkpointed", "uploading", "unpacking",
// "unpacked"). It does nothing outside those tests.
var stepHook = func(step string) {}
