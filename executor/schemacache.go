package executor

// maxCachedSchemas bounds the compiled argument schemas an executor keeps.
const maxCachedSchemas = 4096
