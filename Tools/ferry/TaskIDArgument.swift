import ArgumentParser
import Ferry

// A task id on the command line is its bare number, as `ferry` prints it; a bad one is a usage
// error naming the argument, as a bad number was.
extension TaskID: ExpressibleByArgument {}
