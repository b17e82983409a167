module saferollout.dev/faultproxy

// The standard library only: nothing to download, a build of seconds.
go 1.26.0
