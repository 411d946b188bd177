import Foundation

enum FileHandleStandardError {
  static func write(_ text: String) { FileHandle.standardError.write(Data(text.utf8)) }
}
