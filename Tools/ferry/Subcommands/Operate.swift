import ArgumentParser
import Ferry
import FerryTools

/// The discussion every operator command shares.
private let writes = """
  Writes to the store: it opens it read-write and appends the same events the app's own call \
  would, decided inside one commit. Works while an app or a runner has the store open. A task a \
  runner holds (a run under way, in any process) is never changed: the command says so and exits \
  with status 10; a task that is not queued or not in the state needed exits with status 11.
  """

/// An operator command: the store it writes to, `--json`, and the action it asks for. Their one
/// `run()` opens the store read-write and performs the action (FerryTools' `operate`).
protocol OperatorCommand: AsyncParsableCommand {
  var store: StoreArgument { get }
  var output: OperatorJSON { get }
  var action: OperatorAction { get }
}

extension OperatorCommand {
  func run() async throws {
    let action = self.action
    try await perform { () async throws(ToolError) -> ExitStatus in
      try await operate(path: store.dir, action, json: output.json, output: .standard)
    }
  }
}

/// `--json` for the operator commands.
struct OperatorJSON: ParsableArguments {
  @Flag(help: "Print one JSON object (keys: command, changed, running, refused, …).") var json = false
}

struct Cancel: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract: "Cancel queued tasks: by id, or every task of a tag or a group.",
    discussion: writes
      + "\n\nExamples: ferry cancel /tmp/groceries 4 7   ferry cancel /tmp/groceries --tag sync   "
      + "ferry cancel /tmp/groceries --group list")

  @OptionGroup var store: StoreArgument
  @Argument(help: "Task ids to cancel.") var tasks: [TaskID] = []
  @Option(help: "Cancel every task with this tag that has no run under way.") var tag: String?
  @Option(help: "Cancel every task of this group that has no run under way.") var group: String?
  @OptionGroup var output: OperatorJSON

  func validate() throws {
    let chosen = (tasks.isEmpty ? 0 : 1) + (tag == nil ? 0 : 1) + (group == nil ? 0 : 1)
    guard chosen == 1 else {
      throw ValidationError("give task ids, or --tag, or --group (exactly one of them)")
    }
  }

  var action: OperatorAction {
    if let tag { return .cancelTag(tag) }
    if let group { return .cancelGroup(group) }
    return .cancel(tasks)
  }
}

/// Which tasks a revive or resolve changes: one id, or every one of a tag, of a group, or all.
struct TaskChoice: ParsableArguments {
  @Argument(help: "The task's id.") var task: TaskID?
  @Option(help: "Every such task with this tag.") var tag: String?
  @Option(help: "Every such task of this group.") var group: String?
  @Flag(help: "Every such task in the queue.") var all = false

  func validate() throws {
    let chosen = (task == nil ? 0 : 1) + (tag == nil ? 0 : 1) + (group == nil ? 0 : 1) + (all ? 1 : 0)
    guard chosen == 1 else {
      throw ValidationError("give a task id, or --tag, or --group, or --all (exactly one of them)")
    }
  }
}

struct Revive: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Make dead tasks ready again (their attempt counts are kept): one, or every one of a tag, a group or the queue.",
    discussion: writes
      + "\n\nExamples: ferry revive /tmp/groceries 4   ferry revive /tmp/groceries --tag sync   "
      + "ferry revive /tmp/groceries --all")

  @OptionGroup var store: StoreArgument
  @OptionGroup var choice: TaskChoice
  @OptionGroup var output: OperatorJSON

  var action: OperatorAction {
    if let task = choice.task { return .revive(task) }
    return .reviveMany(tag: choice.tag, group: choice.group)
  }
}

struct Resolve: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract:
      "Resolve recorded errors: the tasks, and their groups, may run again — one, or every one of a tag, a group or the queue.",
    discussion: writes
      + "\n\nExamples: ferry resolve /tmp/groceries 4   ferry resolve /tmp/groceries --group list   "
      + "ferry resolve /tmp/groceries --all")

  @OptionGroup var store: StoreArgument
  @OptionGroup var choice: TaskChoice
  @OptionGroup var output: OperatorJSON

  var action: OperatorAction {
    if let task = choice.task { return .resolve(task) }
    return .resolveMany(tag: choice.tag, group: choice.group)
  }
}

struct Forget: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract: "Forget everything about a cache key (its next state is \"no cache\").",
    discussion: writes + "\n\nExample: ferry forget /tmp/groceries lists")

  @OptionGroup var store: StoreArgument
  @Argument(help: "The cache key.") var key: String
  @OptionGroup var output: OperatorJSON

  var action: OperatorAction { .forget(key) }
}

struct Pause: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract: "Stop automatic running, durably; runs under way finish and are logged.",
    discussion: writes + "\n\nExample: ferry pause /tmp/groceries")

  @OptionGroup var store: StoreArgument
  @OptionGroup var output: OperatorJSON

  var action: OperatorAction { .pause }
}

struct Resume: OperatorCommand {
  static let configuration = CommandConfiguration(
    abstract: "Start automatic running again after a pause.",
    discussion: writes + "\n\nExample: ferry resume /tmp/groceries")

  @OptionGroup var store: StoreArgument
  @OptionGroup var output: OperatorJSON

  var action: OperatorAction { .resume }
}
